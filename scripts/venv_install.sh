# Sourced by the install scripts: `venv_install VENV ARGS...` installs into VENV with uv when VENV has it
# (scripts/setup.sh puts it there first), else with pip; `venv_uninstall VENV PACKAGES...` likewise.
# uv resolved and installed the same versions as pip in a sixth of the time (docs/results.md, "Set-up time").
# uv reads no pip configuration, so the find-links and index pip would use are handed over: on machines whose
# torch 2.13.0 CPU wheel lies in a local folder, that is where pip (and now uv) finds it. --compile-bytecode, as
# pip does: where PYTHONDONTWRITEBYTECODE is set (CI here), nothing would ever cache the compiled modules, and
# every process would compile torch, transformers and ray from source at each import.
venv_install() {
    local venv=$1
    shift
    if [ -x "$venv/bin/uv" ]; then
        local links=${UV_FIND_LINKS:-${PIP_FIND_LINKS:-$("$venv/bin/python" -m pip config get global.find-links 2>/dev/null || true)}}
        local index=${UV_DEFAULT_INDEX:-${PIP_INDEX_URL:-$("$venv/bin/python" -m pip config get global.index-url 2>/dev/null || true)}}
        UV_FIND_LINKS=$links UV_DEFAULT_INDEX=${index:-https://pypi.org/simple} \
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
