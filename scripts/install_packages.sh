# Sourced by scripts/setup.sh and scripts/jupyterhub/setup.sh: install_packages VENV PIP-ARGS...
# installs PIP-ARGS (e.g. -c constraints.txt -e '.[notebooks]') into the virtual environment VENV.
# uv installs the same pinned wheels in parallel (a fresh .venv in ~40 s instead of ~80 s with pip); it does
# not read pip's configuration, so this machine's extra indexes and wheel folders are handed over. If uv
# cannot be had or fails, pip does the install. What either prints goes to VENV/pip-install.log.
# DeepSpeed comes as a source package: DS_BUILD_OPS=0 builds it without compiling its CUDA/C++ ops (it compiles
# the few a run needs on first use). Its sdist has no pyproject.toml, so its isolated build environment holds
# setuptools only, not a second torch: no --no-build-isolation needed (checked with 0.19.8: 3 s to build).
install_packages() {
  local venv=$1; shift
  local -x DS_BUILD_OPS="${DS_BUILD_OPS:-0}"
  local python="$venv/bin/python" log="$venv/pip-install.log"
  "$python" -m pip install -q --upgrade pip uv >"$log" 2>&1 || true
  if [ -x "$venv/bin/uv" ]; then
    local extra links
    extra=$("$python" -m pip config get global.extra-index-url 2>/dev/null || true)
    links=$("$python" -m pip config get global.find-links 2>/dev/null || true)
    links=${PIP_FIND_LINKS:-$links}
    if UV_EXTRA_INDEX_URL="${UV_EXTRA_INDEX_URL:-${PIP_EXTRA_INDEX_URL:-$extra}}" \
       UV_FIND_LINKS="${UV_FIND_LINKS:-${links// /,}}" UV_INDEX_STRATEGY="${UV_INDEX_STRATEGY:-unsafe-best-match}" \
       "$venv/bin/uv" pip install -q --python "$python" --compile-bytecode "$@" >>"$log" 2>&1; then
      return 0
    fi
    echo "setup: uv could not install the packages (its log: $log); installing with pip instead" >&2
  fi
  "$python" -m pip install -q "$@" >>"$log" 2>&1 && return 0
  cat "$log" >&2
  echo "setup: pip install failed (log above, also in $log)" >&2
  return 1
}
