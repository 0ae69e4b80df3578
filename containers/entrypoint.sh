#!/bin/sh
# The image's entry point: a writable HOME and cache folders for whatever uid the run was given
# (`docker run --user "$(id -u):$(id -g)"` starts with HOME=/ and no entry in /etc/passwd), and
# artifact/ checked writable before any session starts, with the one-line fix when it is not.
set -eu
artifact=${MULTICARD_ARTIFACT:-/opt/multicard/artifact}  # where the host folder is bound
fix="run as the owner of the host folder bound there: docker run --user \"\$(id -u):\$(id -g)\" -v \"\$PWD/artifact:$artifact\" ... (rootless podman: add --userns=keep-id)"
# the folders runs write into, where they exist (a clone once chowned to another uid keeps them)
for folder in "$artifact" "$artifact/runs" "$artifact/cache"; do
    if [ "$folder" = "$artifact" ] || [ -e "$folder" ]; then
        if ! [ -w "$folder" ] || ! [ -x "$folder" ]; then
            echo "multicard: $folder is not writable by uid $(id -u): $fix" >&2
            exit 2
        fi
    fi
done
if [ -z "${HOME:-}" ] || [ "$HOME" = / ] || ! [ -w "$HOME" ]; then
    HOME="${TMPDIR:-/tmp}/multicard-home-$(id -u)"
    if ! mkdir -p "$HOME" 2>/dev/null; then
        echo "multicard: no writable HOME for uid $(id -u) ($HOME): give the container a writable /tmp (--tmpfs /tmp) or -e HOME=<a writable folder>" >&2
        exit 2
    fi
    export HOME
fi
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
export MPLCONFIGDIR="${MPLCONFIGDIR:-$XDG_CACHE_HOME/matplotlib}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$XDG_CACHE_HOME/triton}"
export HF_HOME="${HF_HOME:-$XDG_CACHE_HOME/huggingface}"
exec "$@"
