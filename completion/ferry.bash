# SPDX-License-Identifier: Apache-2.0
# bash completion for ferry: its commands, each command's modes (bench
# target|initiator|...) and options. Read from what the binary prints
# (`ferry help`, `ferry COMMAND --help`) when completing, so it follows the
# CLI's help without being regenerated. Installed as
# ${datadir}/bash-completion/completions/ferry (loaded on first use).
_ferry_commands() {
  "$1" help 2>/dev/null | awk '/^  [a-z][a-z0-9-]* / { print $1 }'
  echo help
}

_ferry() {
  local cur=${COMP_WORDS[COMP_CWORD]} bin=${COMP_WORDS[0]}
  if [ "$COMP_CWORD" -le 1 ]; then
    COMPREPLY=($(compgen -W "$(_ferry_commands "$bin") --help --version" -- "$cur"))
    return
  fi
  local cmd=${COMP_WORDS[1]} help words
  if [ "$cmd" = help ]; then
    COMPREPLY=($(compgen -W "$(_ferry_commands "$bin")" -- "$cur"))
    return
  fi
  help=$("$bin" "$cmd" --help 2>&1)
  if [[ $cur == -* ]]; then
    words=$(printf '%s\n' "$help" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u)
  elif [ "$COMP_CWORD" -eq 2 ]; then
    # modes named in the usage lines: "ferry bench target ...", "ferry cluster report ..."
    words=$(printf '%s\n' "$help" | sed -n "s/^.*ferry $cmd \([a-z][a-z0-9-]*\).*/\1/p" | sort -u)
  fi
  [ -n "$words" ] && COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _ferry ferry
