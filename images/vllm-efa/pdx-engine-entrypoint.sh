#!/bin/sh
# pdx-engine-entrypoint: the serving image's entrypoint (installed as
# /usr/local/bin/pdx-engine-entrypoint). Checks EFA when asked, then execs its arguments.
#
# With PDX_REQUIRE_EFA=1 (rendered by the operator when the engines use EFA), the engine must
# not start unless libfabric's EFA provider is usable: NIXL would otherwise fall back to TCP
# without a word. On failure it writes one line "<Reason>: <message>" to the termination log
# (Kubernetes shows it as the container's termination message; the operator turns it into a
# condition) and exits 78 (EX_CONFIG).
#
# With PDX_REQUIRE_EFA=1 it then runs the engine as a child, its stdout and stderr merged and
# passed through line by line, and watches the start-up for proof that NIXL runs LIBFABRIC:
#   NIXL (nixl_cu13/_api.py:405)  "Backend LIBFABRIC was instantiated"   (INFO, on stdout)
#   NIXL (nixl_cu13/_api.py:252)  "Skipping backend registration LIBFABRIC due to the missing plugin."
#   vLLM (api_server/entry.py:140) "Starting vLLM server on ..."; uvicorn "Application startup complete."
# Any other backend instantiated (UCX on EFA silently runs over TCP), or the LIBFABRIC plugin
# missing, is NIXLBackendNotLibfabric; the server starting without the LIBFABRIC line having been
# seen is NIXLBackendUnverified. Either stops the engine and exits 78. Once the server is up with
# LIBFABRIC, the output is passed through unwatched; the entrypoint exits with the engine's status.
# Without the requirement it execs its arguments.
#
# Environment:
#   PDX_REQUIRE_EFA          1/true: check; unset, empty, 0/false: no check; anything else: refuse
#   FI_PROVIDER              if set with PDX_REQUIRE_EFA=1, it must be "efa"
#   PDX_TERMINATION_LOG      where the one-line reason goes (default /dev/termination-log)
#   NIXL_LOG_LEVEL           must not hide NIXL's INFO lines (WARN, ERROR, FATAL) with PDX_REQUIRE_EFA=1
#   PDX_ENGINE_STOP_GRACE    seconds between SIGTERM and SIGKILL when refusing a started engine (30)
set -eu

TERMINATION_LOG=${PDX_TERMINATION_LOG:-/dev/termination-log}
PROG=pdx-engine-entrypoint
REQUIRE_EFA=0

fail() {
    reason=$1
    shift
    # One line, at most 1000 bytes (Kubernetes keeps 4096 of the termination message).
    line=$(printf '%s: %s' "$reason" "$*" | tr '\n\r\t' '   ' | cut -c 1-1000)
    printf '%s: FATAL: %s\n' "$PROG" "$line" >&2
    if ! printf '%s\n' "$line" > "$TERMINATION_LOG" 2>/dev/null; then
        printf '%s: could not write the termination log %s\n' "$PROG" "$TERMINATION_LOG" >&2
    fi
    exit 78
}

check_efa() {
    provider=${FI_PROVIDER:-}
    if [ -n "$provider" ] && [ "$provider" != "efa" ]; then
        fail EFAProviderOverridden "FI_PROVIDER=$provider, but PDX_REQUIRE_EFA=1 requires the efa provider (unset FI_PROVIDER or set it to efa)"
    fi
    if ! command -v fi_info > /dev/null 2>&1; then
        fail EFAUnavailable "fi_info is not on PATH: the image lacks the EFA userspace (libfabric from the EFA installer in /opt/amazon/efa)"
    fi
    status=0
    out=$(fi_info -p efa -t FI_EP_RDM 2>&1) || status=$?
    if [ "$status" -ne 0 ]; then
        fail EFAUnavailable "fi_info -p efa -t FI_EP_RDM found no EFA provider (exit $status: $out); is vpc.amazonaws.com/efa requested and the EFA device plugin running on this node?"
    fi
    case $out in
        *"provider: efa"*) ;;
        *) fail EFAUnavailable "fi_info -p efa -t FI_EP_RDM listed no efa provider: $out" ;;
    esac
    count=$(printf '%s\n' "$out" | grep -c "provider: efa" || true)
    printf '%s: EFA provider found (%s RDM endpoint(s)); KV transfer can use LIBFABRIC over EFA\n' "$PROG" "$count" >&2
}

case ${PDX_REQUIRE_EFA:-} in
    1 | true) check_efa && REQUIRE_EFA=1 ;;
    "" | 0 | false) ;;
    *) fail InvalidConfig "PDX_REQUIRE_EFA=${PDX_REQUIRE_EFA} is not one of 1, true, 0, false" ;;
esac

check_nixl_log_level() {
    case $(printf '%s' "${NIXL_LOG_LEVEL:-}" | tr '[:lower:]' '[:upper:]') in
        WARN | ERROR | FATAL)
            fail NIXLBackendUnverified "NIXL_LOG_LEVEL=${NIXL_LOG_LEVEL} hides NIXL's 'Backend LIBFABRIC was instantiated' line, the proof that KV transfer runs over EFA (unset it, or set INFO or DEBUG)"
            ;;
    esac
}

# Refuse a started engine: the reason to the termination log, then stop the engine.
refuse_started() {
    engine=$1
    shift
    (fail "$@") || true
    printf '%s: stopping the engine (pid %s)\n' "$PROG" "$engine" >&2
    kill -TERM "$engine" 2>/dev/null || true
    (
        sleep "${PDX_ENGINE_STOP_GRACE:-30}"
        kill -KILL "$engine" 2>/dev/null || true
    ) > /dev/null 2>&1 &
    # Keep passing the engine's shutdown output through until it closes the pipe.
    cat
    exit 78
}

# Reads the engine's output on stdin, passes it through; exit 78 after a refusal, else 0.
watch_start() {
    engine=$1
    libfabric=0
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line"
        case $line in
            *"Backend LIBFABRIC was instantiated"*) libfabric=1 ;;
            *"Skipping backend registration LIBFABRIC due to the missing plugin"*)
                refuse_started "$engine" NIXLBackendNotLibfabric "NIXL has no LIBFABRIC plugin, so KV transfer cannot use EFA; the engine logged: $line"
                ;;
            *"Backend "*" was instantiated"*)
                refuse_started "$engine" NIXLBackendNotLibfabric "NIXL instantiated a backend other than LIBFABRIC (UCX on EFA silently runs over TCP; set kvTransfer.backends to [LIBFABRIC]); the engine logged: $line"
                ;;
            *"Starting vLLM server on"* | *"Application startup complete"*)
                if [ "$libfabric" -ne 1 ]; then
                    refuse_started "$engine" NIXLBackendUnverified "the server started but NIXL never logged 'Backend LIBFABRIC was instantiated', so KV transfer may not use EFA (is kv_connector NixlConnector with backends [LIBFABRIC], and NIXL's log at INFO?); the engine logged: $line"
                fi
                printf '%s: NIXL instantiated LIBFABRIC before the server started: KV transfer uses EFA\n' "$PROG" >&2
                cat
                exit 0
                ;;
        esac
    done
    exit 0
}

run_watched() {
    dir=$(mktemp -d)
    fifo=$dir/engine-output
    mkfifo "$fifo"
    "$@" > "$fifo" 2>&1 &
    engine=$!
    watch_start "$engine" < "$fifo" &
    watcher=$!
    trap 'kill -TERM "$engine" 2>/dev/null || true' TERM
    trap 'kill -INT "$engine" 2>/dev/null || true' INT
    trap 'kill -HUP "$engine" 2>/dev/null || true' HUP
    # wait returns early (>128) when a trapped signal arrives: wait again until the engine is gone.
    while :; do
        status=0
        wait "$engine" || status=$?
        kill -0 "$engine" 2>/dev/null || break
    done
    watched=0
    wait "$watcher" || watched=$?
    rm -rf "$dir"
    if [ "$watched" -eq 78 ]; then
        exit 78
    fi
    exit "$status"
}

if [ "$#" -eq 0 ]; then
    fail InvalidConfig "no command given to run (expected e.g. vllm serve MODEL ...)"
fi
if [ "$REQUIRE_EFA" -eq 1 ]; then
    check_nixl_log_level
    run_watched "$@"
fi
exec "$@"
