#!/bin/sh
# The image's entry point: a writable HOME and cache folders for whatever uid the run was given
# (`docker run --user "$(id -u):$(id -g)"` starts with HOME=/ and no entry in /etc/passwd), and
# artifact/ checked writable before any session starts, with the one-line fix when it is not.
set -eu
if [ -z "${HOME:-}" ] || [ "$HOME" = / ] || ! [ -w "$HOME" ]; then
    HOME="${TMPDIR:-/tmp}/multicard-home-$(id -u)"
    mkdir -p "$HOME"
    export HOME
fi
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"
export MPLCONFIGDIR="${MPLCONFIGDIR:-$XDG_CACHE_HOME/matplotlib}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$XDG_CACHE_HOME/triton}"
export HF_HOME="${HF_HOME:-$XDG_CACHE_HOME/huggingface}"
artifact=${MULTICARD_ARTIFACT:-/opt/multicard/artifact}  # where the host folder is bound
if ! [ -w "$artifact" ] || ! [ -x "$artifact" ]; then
    echo "multicard: $artifact is not writable by uid $(id -u): run as the owner of the host folder bound there, e.g. docker run --user \"\$(id -u):\$(id -g)\" -v \"\$PWD/artifact:$artifact\" ..." >&2
    exit 2
fi
exec "$@"
