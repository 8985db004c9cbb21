#!/usr/bin/env bash
# Moved to tools/fetch_model.sh (issue 21); this path stays until .ci/run's model stage uses the new one.
exec bash "$(dirname "$0")/../tools/fetch_model.sh" "$@"
