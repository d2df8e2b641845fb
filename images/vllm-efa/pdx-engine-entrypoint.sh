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
# Environment:
#   PDX_REQUIRE_EFA          1/true: check; unset, empty, 0/false: no check; anything else: refuse
#   FI_PROVIDER              if set with PDX_REQUIRE_EFA=1, it must be "efa"
#   PDX_TERMINATION_LOG      where the one-line reason goes (default /dev/termination-log)
set -eu

TERMINATION_LOG=${PDX_TERMINATION_LOG:-/dev/termination-log}
PROG=pdx-engine-entrypoint

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
    1 | true) check_efa ;;
    "" | 0 | false) ;;
    *) fail InvalidConfig "PDX_REQUIRE_EFA=${PDX_REQUIRE_EFA} is not one of 1, true, 0, false" ;;
esac

if [ "$#" -eq 0 ]; then
    fail InvalidConfig "no command given to run (expected e.g. vllm serve MODEL ...)"
fi
exec "$@"
