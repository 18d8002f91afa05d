"""What an unrecognized argument of the command line is: another command's option, a near miss, your
code's argument.

    python -c "from simcluster.launcher.parser import build_parser; from simcluster.launcher.parser_hints import unknown_hint; print(unknown_hint(build_parser(), 'up', ['--mehs'], False))"

launcher/cli.py calls ``unknown_hint`` on the error path only (it builds every command's parser).
"""
from __future__ import annotations

import argparse


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
