#!/usr/bin/env bash
# The platform's processes never run as root (webapp/privileges.py): started as root, they become an
# unprivileged user. `make run`, when run as root, calls this first: it creates that user
# (PLATFORM_USER, default agenttrainer) and lets it enter the folders that lead to the interpreter
# (an interpreter installed under root's home is world-readable, but /root itself is not enterable).
# Usage: scripts/service_user.sh <the virtual environment's python>
set -euo pipefail
[ "$(id -u)" -eq 0 ] || exit 0
user="${PLATFORM_USER:-agenttrainer}"
python="$1"
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
as_user() { setpriv --reuid="$user" --regid="$user" --clear-groups "$@"; }
# The same interpreter, not another that a failed lookup falls back to (the system's Python).
prefix="$("$python" -c 'import sys; print(sys.base_prefix)')"
reaches() { [ "$(as_user "$python" -c 'import sys, django, torch; print(sys.base_prefix)' 2>/dev/null)" = "$prefix" ]; }
reaches && exit 0
command -v setfacl >/dev/null || (apt-get update -q && apt-get install -y -q acl)
for path in "$(readlink -f "$python")" "$(cd "$(dirname "$python")/.." && pwd)"; do
  dir=""
  for part in $(dirname "$path" | tr '/' ' '); do  # from the top down: only the folders that stop it
    dir="$dir/$part"
    as_user test -x "$dir" || { setfacl -m "u:$user:x" "$dir"; echo "let $user enter $dir (traverse only)"; }
  done
done
reaches || { echo "$user still cannot run $python" >&2; exit 1; }
