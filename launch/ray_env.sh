# Sourced by the launch scripts: which `ray` and `python` to run. COATI_RAY / COATI_PYTHON when set; else the
# active virtual environment's (VIRTUAL_ENV); else the checkout's .venv (what scripts/setup.sh installs); else
# the ones on PATH.
pick() {  # pick NAME: the path of the tool NAME by the rule above
    if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/$1" ]; then echo "$VIRTUAL_ENV/bin/$1"
    elif [ -x ".venv/bin/$1" ]; then echo "$PWD/.venv/bin/$1"
    else command -v "$1" || { echo "error: no '$1' found: run scripts/setup.sh, activate your environment, or set COATI_${1^^}" >&2; exit 2; }
    fi
}
RAY=${COATI_RAY:-$(pick ray)}
PYTHON=${COATI_PYTHON:-$(pick python)}
