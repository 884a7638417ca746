# Sourced by the scripts that run the project's Python (.venv, made by scripts/setup): without it they
# would die on a missing interpreter deep inside; this says what to run instead, in one line.
#   . "$root/scripts/need_venv.sh"; need_venv NAME      (NAME: the calling script, for the message)
need_venv() {
  [ -x "$root/.venv/bin/python" ] ||
    { echo "$1: no Python environment in $root/.venv: run scripts/setup first" >&2; exit 1; }
}
