# bash completion for dlock(1). Install as
# $(pkg-config --variable=completionsdir bash-completion)/dlock
# (usually /usr/share/bash-completion/completions/dlock).

_dlock()
{
    local cur prev words cword
    if declare -F _init_completion >/dev/null; then
        _init_completion || return
    else
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    fi

    # The subcommand, and whether COMMAND has begun ("--" after it).
    local i sub="" dashdash=0
    for ((i = 1; i < cword; i++)); do
        case ${words[i]} in
        --url) ((i++)) ;;
        --url=*) ;;
        --) [[ -n $sub ]] && dashdash=$i && break ;;
        -*) ;;
        *) [[ -z $sub ]] && sub=${words[i]} ;;
        esac
    done

    if ((dashdash)); then
        # COMMAND [ARG...]: complete as the shell would.
        if declare -F _command_offset >/dev/null; then
            _command_offset $((dashdash + 1))
        else
            COMPREPLY=($(compgen -c -- "$cur"))
        fi
        return
    fi

    case $prev in
    --url)
        # The schemes the dlock being completed knows (its library's list).
        COMPREPLY=($(compgen -W "$("${words[0]}" --list-schemes 2>/dev/null | sed 's,$,://,')" -- "$cur"))
        compopt -o nospace 2>/dev/null
        return ;;
    --ttl | --wait | --grace)
        COMPREPLY=($(compgen -W "500ms 5s 30s 1m 10m 1h 1d $([[ $prev == --wait ]] && echo forever)" -- "$cur"))
        return ;;
    -E | --command-status-offset | --permits | --id | --label | -c)
        return ;;
    esac

    case $sub in
    "")
        COMPREPLY=($(compgen -W "run elect status list release demo --url --help --version
                               --list-schemes" -- "$cur")) ;;
    run)
        COMPREPLY=($(compgen -W "--ttl --wait --grace -E --shared --exclusive --permits --kill-group
                               --command-status-offset --label -c -v -vv --stats --help --" -- "$cur")) ;;
    elect)
        COMPREPLY=($(compgen -W "--ttl --grace --id --once --kill-group --command-status-offset
                               -c -v -vv --stats --help --" -- "$cur")) ;;
    status | list)
        COMPREPLY=($(compgen -W "--json --help" -- "$cur")) ;;
    release)
        COMPREPLY=($(compgen -W "--force --help" -- "$cur")) ;;
    esac
}
complete -F _dlock dlock
