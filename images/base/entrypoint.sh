#!/bin/sh
# forgekit's entrypoint: run forgekit as the owner of the working folder (the workspace mounted at /work), so a
# `docker run -v "$PWD:/work" forgekit/cpu ...` one-shot can write there whoever owns it (the user, root on a
# CI runner) and what it writes belongs to that owner.  Started with --user, it runs as that user and does not
# switch; a folder that user cannot write is then one forgekit error line saying what to do.
set -eu
if [ "$(id -u)" = 0 ] && [ -z "${FORGEKIT_KEEP_ROOT:-}" ]; then
    uid=$(stat -c %u .)
    gid=$(stat -c %g .)
    if [ "$uid" != 0 ]; then
        home=$(getent passwd "$uid" | cut -d: -f6 || true)
        [ -n "$home" ] && [ -d "$home" ] || home=/tmp
        export HOME="$home"
        exec setpriv --reuid="$uid" --regid="$gid" --clear-groups forgekit "$@"
    fi
fi
exec forgekit "$@"
