"""The command line's edge cases before and after argparse: a negative value argparse would take for a
flag, and what an unrecognized argument is (another command's option, a near miss, your code's argument).

    python -c "from simcluster.launcher.parser_hints import fix_negative_values; print(fix_negative_values(['--mesh', '-1x2x2']))"

launcher/cli.py calls them: ``fix_negative_values`` on the launcher's own arguments before parsing,
``given_twice`` after it (a flag given twice is refused, never the last silently kept), ``unknown_hint``
on the error path only (it builds every command's parser).
"""
from __future__ import annotations

import argparse
import re


def fix_negative_values(argv: list[str], flags: tuple[str, ...] = ("--mesh",)) -> list[str]:
    """``--mesh -1x2x2`` -> ``--mesh=-1x2x2`` so argparse passes it on (to fail in parse_mesh)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


REPEATABLE = (argparse._AppendAction, argparse._CountAction, argparse._HelpAction, argparse._VersionAction)


def given_twice(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first option of ``parser`` (a command's) given more than once in ``argv`` (the launcher's own
    arguments, flags as typed or ``--flag=value``, a prefix argparse takes resolved) that is not repeatable
    (``--env``, ``--mount``... append): ``--nodes: given twice (--nodes 2, --nodes 3)...``; None when none is.
    argparse keeps the last silently: the first would be dropped unsaid."""
    strings = parser._option_string_actions
    seen: dict[argparse.Action, list[str]] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        flag, eq, value = token.partition("=")
        matches = [strings[flag]] if flag in strings else \
            list({id(a): a for s, a in strings.items() if parser.allow_abbrev and s.startswith(flag)}.values())
        if len(matches) != 1 or isinstance(matches[0], REPEATABLE):
            continue
        action = matches[0]
        shown = token if eq or action.nargs == 0 or i + 1 >= len(argv) else f"{token} {argv[i + 1]}"
        seen.setdefault(action, []).append(shown)
        if len(seen[action]) > 1:
            name = action.option_strings[-1]
            return (f"{name}: given twice ({', '.join(seen[action])}); argparse would keep the last and drop the "
                    f"first unsaid; give it once, e.g. {seen[action][-1]}")
    return None


def unknown_hint(parser: argparse.ArgumentParser, command: str, unknown: list[str], yours: bool) -> str:
    """What an unrecognized argument is: an option of another command (named), close to one of this
    command's (did you mean), else, for a job of your code, your code's argument (after --). A flag of
    the launcher is never handed to your code as the fix."""
    import difflib

    from simcluster.launcher.job.fields import flag
    from simcluster.launcher.job.sections import TrainerOptions, specs

    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    own = [f for f in subs[command]._option_string_actions if f.startswith("--")]
    trainer = {flag(name) for name in specs(TrainerOptions)}  # your code may take these: after --
    hints, loose, value_of_refused = [], [], False
    for arg in unknown:
        name = arg.split("=")[0]
        if not name.startswith("-"):
            if not value_of_refused:
                loose.append(arg)
            value_of_refused = False
            continue
        value_of_refused = "=" not in arg
        others = sorted((c for c, p in subs.items() if c != command and name in p._option_string_actions),
                        key=lambda c: c != "up")
        close = difflib.get_close_matches(name, own, n=2, cutoff=0.75)
        if others and not (yours and name in trainer):
            hints.append(f"{name}: an option of `{others[0]}` that {command} does not take (its options: "
                         f"python -m launcher {command} --help)")
        elif close:
            hints.append(f"{name}: no option of {command}; did you mean {' or '.join(close)}?")
        else:
            loose.append(arg)
            value_of_refused = False
    if loose and yours:
        hints.append(f"{'compare takes no trainer options: ' if command == 'compare' else ''}your code's arguments "
                     f"go after --, e.g. ... -- {' '.join(loose)}")
    elif loose:
        hints.append(f"its options: python -m launcher {command} --help")
    return "; " + "; ".join(hints)
