# runbox: sourced by bash (through BASH_ENV) before the code of every bash run.
#
# Each run is a fresh `bash -c CODE`; what persists between runs is the working directory
# and the exported variables. At exit this saves both to the state pipe runbox passed as
# fd 3 (moved to a high descriptor first, so the code is free to use fd 3), NUL-separated:
# the directory, then KEY=VALUE for each exported variable. runbox hands them back as the
# next run's directory and environment: nothing is re-parsed as shell code.
unset BASH_ENV
exec {__runbox_state_fd}>&3 3>&-
cd -- "${RUNBOX_CWD:-/workspace}" 2>/dev/null || cd /workspace
unset RUNBOX_CWD
__runbox_save_state() {
    local __runbox_n
    {
        printf '%s\0' "$PWD"
        for __runbox_n in $(compgen -e); do
            printf '%s=%s\0' "$__runbox_n" "${!__runbox_n}"
        done
    } >&"$__runbox_state_fd" 2>/dev/null
}
trap __runbox_save_state EXIT
