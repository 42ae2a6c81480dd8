# Sourced by the install scripts: `venv_install VENV ARGS...` installs into VENV with uv when VENV has it
# (scripts/setup.sh puts it there first), else with pip; `venv_uninstall VENV PACKAGES...` likewise.
# uv installed the same versions as pip; the whole set-up took about half the time (docs/results.md, "Set-up
# with uv"). uv reads no pip configuration, so the find-links and index pip would use are handed over (read from
# pip once per install script): where torch 2.13.0's CPU wheel lies in a local folder, that is where uv finds it.
# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI here), nothing would ever cache the
# compiled modules, and every process would compile torch, transformers and ray from source at each import.
venv_install() {
    local venv=$1
    shift
    if [ -x "$venv/bin/uv" ]; then
        if [ -z "${_VENV_INSTALL_PIP_READ:-}" ]; then
            local cfg=("$venv/bin/python" -m pip config get)
            _VENV_INSTALL_LINKS=${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$("${cfg[@]}" global.find-links 2>/dev/null || true)}}
            _VENV_INSTALL_INDEX=${UV_DEFAULT_INDEX:-${PIP_INDEX_URL:-$("${cfg[@]}" global.index-url 2>/dev/null || true)}}
            _VENV_INSTALL_PIP_READ=1
        fi
        UV_FIND_LINKS=$_VENV_INSTALL_LINKS UV_DEFAULT_INDEX=${_VENV_INSTALL_INDEX:-https://pypi.org/simple} \
            "$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" "$@"
    else
        "$venv/bin/python" -m pip install -q "$@"
    fi
}

venv_uninstall() {
    local venv=$1
    shift
    if [ -x "$venv/bin/uv" ]; then
        "$venv/bin/uv" pip uninstall --quiet --python "$venv/bin/python" "$@"
    else
        "$venv/bin/python" -m pip uninstall -y -q "$@"
    fi
}
