"""The command line's defaults are the ones the documents state: each expected value is read
from its sentence in README.md or docs/*.md (correctness_tests/documents.py: one such sentence
in them all), so the two cannot drift apart, and a default changed in one place alone fails
here (a compare gap raised from 5% to 15% passed every other CPU test)."""

from __future__ import annotations

import argparse
import re

import pytest

from correctness_tests import documents
from kernels import cli
from kernels.bench import asv_tools
from kernels.cli import arguments

_documented = documents.sentence


def _percent(text: str) -> float:
    return float(text) / 100


def _parser() -> arguments.Parser:
    """The parser `python -m kernels` builds, every command group on it."""
    return cli.build_parser()[0]


def _commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_its_handler_and_well_formed_documented_options():
    """What `python -m kernels --help` lists is what runs: each command its own handler, every
    option a lower-case --long-name with help text (what the README check and users type)."""
    commands = _commands()
    handlers = cli.build_parser()[1]
    assert set(handlers) == set(commands) and len(commands) >= 18, sorted(commands)
    assert all(callable(handler) for handler in handlers.values())
    for name, parser in commands.items():
        assert re.fullmatch(r"[a-z][a-z-]*", name), name
        for action in parser._actions:
            assert action.help, (name, action.dest)
            for option in action.option_strings:
                assert re.fullmatch(r"--[a-z][a-z0-9-]*|-h", option), (name, option)
            if not action.option_strings:  # a positional: its name is what --help shows
                assert re.fullmatch(r"[a-z][a-z_]*", action.dest), (name, action.dest)
    (sub,) = (a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    listed = {choice.dest: choice.help for choice in sub._choices_actions}
    assert set(listed) == set(commands) and all(
        text and not text.isupper() for text in listed.values()), listed


# Options whose value is free text: names looked up where they are used (an operation, an
# implementation, a case, tags, an asv machine, a benchmark regex, families and operations of
# gate-power, faults of the drill, what `time --versus` divides by) and files a command writes.
# Every other option that takes a value checks it as it is parsed (a type or choices), so a
# typo fails there, in one line.
FREE_TEXT = {"op", "impl", "case", "tags", "machine", "bench", "families", "ops", "faults",
             "json", "summary_md", "versus"}


def test_every_option_that_takes_a_value_checks_it_unless_it_is_a_name_or_a_file():
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.nargs == 0 or action.dest in FREE_TEXT:
                continue
            assert action.type is not None or action.choices is not None, (name, action.dest)
            checked += 1
    assert checked >= 40, checked


def test_options_said_to_repeat_or_defaulting_to_lists_take_several_values():
    """"(repeatable)" in a help means the option may be given again (append); a list default
    means the option takes several values at once (nargs + or *)."""
    for name, parser in _commands().items():
        for action in parser._actions:
            if "repeatable" in (action.help or ""):
                assert isinstance(action, argparse._AppendAction), (name, action.dest)
            if isinstance(action.default, list):
                assert action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction), \
                    (name, action.dest)


def test_each_options_value_lands_under_its_own_name():
    """Every option's value is read by its handler as args.<long name, dashes as underscores>
    (argparse's own rule, kept wherever a dest is written out)."""
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                longest = max(action.option_strings, key=len)
                assert action.dest == longest.lstrip("-").replace("-", "_"), (name, longest)


def _values_for(action: argparse.Action) -> list[str]:
    """Three command-line words the option accepts (its choices, or words its type takes)."""
    if action.choices is not None:
        choices = list(action.choices)
        return [choices[i % len(choices)] for i in range(3)]
    for words in (["a", "b", "c"], ["1", "2", "3"], ["m=1", "n=2,3", "k=4"]):
        try:
            [action.type(word) for word in words if action.type is not None]
        except (argparse.ArgumentTypeError, TypeError, ValueError):
            continue
        return words
    raise AssertionError(f"no words found that {action.dest}'s type takes")


def test_name_lists_take_each_word_whole_and_accumulate_or_replace_their_default():
    """An option taking several values keeps each word whole; given again it adds to what it
    holds when it has no default (`--impl a b --impl c`: a, b and c), and replaces a list
    default rather than adding to it (`--tools asv`: asv alone)."""
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.nargs not in ("+", "*") and not isinstance(action, argparse._ExtendAction):
                continue
            alone = argparse.ArgumentParser(exit_on_error=False)
            alone._add_action(action)
            option, words = action.option_strings[0], _values_for(action)
            typed = [action.type(w) if action.type else w for w in words]
            replaces = isinstance(action.default, list)
            argv = [option, *words[:2]] if replaces else [option, *words[:2], option, words[2]]
            try:
                parsed, left = alone.parse_known_args(argv)
            except argparse.ArgumentError as error:
                raise AssertionError(f"{name} {' '.join(argv)}: {error}") from None
            got = getattr(parsed, action.dest)
            assert (got, left) == (typed[:2] if replaces else typed, []), (name, argv, got, left)
            checked += 1
    assert checked >= 20, checked


# Options whose help describes a default computed where the command runs ("(default: all)",
# "(default: this device model)"): their parsed default is None.
COMPUTED_DEFAULTS = {("check", "op"), ("compare", "machine"), ("recover", "machine"),
                     ("plot-roofline", "out"), ("verify-timing", "impl"),
                     ("memory", "direction")}


def test_the_help_states_each_literal_default_the_option_has():
    """Where an option's help says "(default X)" with X a plain value, X is its default; a
    default the help describes rather than states is one of COMPUTED_DEFAULTS."""
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            said = re.search(r"\(default[: ]+([\w.\-/ ]+)\)", action.help or "")
            if not said or action.default is False:
                continue  # no stated default, or a switch ("(default: once)")
            if action.default is None:
                assert (name, action.dest) in COMPUTED_DEFAULTS, (name, action.dest, said[1])
                continue
            default = action.default
            shown = (" ".join(map(str, default)) if isinstance(default, list)
                     else f"{default:g}" if isinstance(default, int | float) else str(default))
            assert shown == said.group(1), (name, action.dest, default, said.group(1))
            checked += 1
    assert checked >= 14, checked


def test_choices_are_the_names_the_code_knows():
    """A direction, regime or dtype offered on the command line is one the code takes: the
    choices are the registry's, the timer's and the dtype table's names, spelled as there."""
    from kernels.core import dtypes, registry, timing

    known = {"direction": set(registry.DIRECTIONS), "regime": set(timing.REGIMES),
             "dtype": set(dtypes.NAMES)}
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            if action.dest in known:
                assert set(action.choices or ()) == known[action.dest], (name, action.dest)
                checked += 1
    assert checked >= 9, checked


def test_a_stated_lower_bound_is_the_one_the_option_checks():
    """"at least N" in a help: N is taken and N - 1 refused as the option is parsed."""
    checked = 0
    for name, parser in _commands().items():
        for action in parser._actions:
            bound = re.search(r"at least (\d+)", action.help or "")
            if bound:
                least = int(bound[1])
                assert action.type(str(least)) == least, (name, action.dest)
                with pytest.raises(argparse.ArgumentTypeError):
                    action.type(str(least - 1))
                checked += 1
    assert checked >= 2, checked


def test_folders_written_refuse_a_file_and_read_files_must_exist(tmp_path):
    """Every --out is a folder to write into, refused as parsed where a file stands there;
    the data file plot-roofline reads must exist (one usage line, not a traceback later)."""
    a_file = tmp_path / "taken"
    a_file.write_text("")
    outs = [(name, action) for name, parser in _commands().items()
            for action in parser._actions if action.dest == "out"]
    assert len(outs) >= 3, outs
    for name, action in outs:
        assert action.type is not None, name
        with pytest.raises(argparse.ArgumentTypeError):
            action.type(str(a_file))
        assert action.type(str(tmp_path / "new")) == str(tmp_path / "new")
    (data,) = (a for a in _commands()["plot-roofline"]._actions if a.dest == "json")
    with pytest.raises(argparse.ArgumentTypeError):
        data.type(str(tmp_path / "absent.json"))


# What a command cannot run without is required as it is parsed, so its absence is a usage
# line rather than an error deep in the handler.
REQUIRED = {("profile", "case"), ("bottleneck", "impl"), ("bottleneck", "case")}


def test_the_options_a_command_cannot_run_without_are_required():
    required = {(name, action.dest) for name, parser in _commands().items()
                for action in parser._actions if action.option_strings and action.required}
    assert required == REQUIRED
    assert _defaults("check")["op"] is None  # check's operation is optional: all of them


@pytest.mark.parametrize("argv,flag", [
    (("fault-drill", "--keep"), "keep"), (("fault-drill", "--without-isolation"),
                                         "without_isolation"),
    (("gate-power", "--keep"), "keep"), (("gate-power", "--no-speedup"), "no_speedup"),
    (("bench", "--reuse-base"), "reuse_base")], ids=" ".join)
def test_switches_take_no_value_and_flip_their_default(argv, flag):
    off, on = _defaults(argv[0])[flag], _defaults(*argv)[flag]
    assert isinstance(off, bool) and on is (not off)


def _defaults(*argv: str) -> dict:
    return vars(_parser().parse_args(list(argv)))


GAP = _percent(*_documented(r"(\d+)% \(`--min-gap`\)"))


def test_a_default_is_read_from_whichever_document_states_it_and_stated_once(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("a gap of 1% (`--min-gap`) here\n")
    (tmp_path / "docs" / "x.md").write_text("and a gap of 2%\n(`--min-gap`) there\n")
    with pytest.raises(AssertionError, match="docs/x.md"):
        documents.sentence(r"(\d+)% \(`--min-gap`\)", tmp_path)
    (tmp_path / "README.md").write_text("no gap stated\n")
    assert documents.sentence(r"(\d+)% \(`--min-gap`\)", tmp_path) == ("2",)
    (tmp_path / "docs" / "x.md").write_text("nothing here either\n")
    with pytest.raises(AssertionError, match="expected one sentence"):
        documents.sentence(r"(\d+)% \(`--min-gap`\)", tmp_path)


def test_the_readme_states_one_compare_gap_and_the_gate_uses_it():
    assert asv_tools.DEFAULT_MIN_GAP == pytest.approx(GAP)


def test_bench_confirms_slower_rows_as_documented_and_compare_does_not():
    (rounds,) = _documented(r"`--confirm-rounds`, (\d+) by default")
    assert _defaults("bench")["confirm_rounds"] == int(rounds)
    assert _defaults("compare", "HEAD")["confirm_rounds"] == 0
    assert not _defaults("bench")["reuse_base"]


@pytest.mark.parametrize("argv", [("bench",), ("bench", "--base", "HEAD"), ("compare", "HEAD")],
                         ids=" ".join)
def test_bench_and_compare_default_to_the_documented_gap(argv):
    assert _defaults(*argv)["min_gap"] == pytest.approx(GAP)


def test_bench_and_compare_default_to_head():
    assert _defaults("bench")["head"] == _defaults("compare", "HEAD~0")["head"] == "HEAD"
    assert _defaults("bench")["base"] is None
    assert _defaults("noise-floor")["revision"] == "HEAD"


def test_gate_power_defaults_are_the_documented_plan():
    small, large, trials = _documented(
        r"gate-power +# GPU: (\d+)% and (\d+)% plants x(\d+) in every family, A/A, a speed-up")
    (factor,) = _documented(r"the mark asv's own test gives at `-f ([\d.]+)`")
    args = _defaults("gate-power")
    assert args["aa_trials"] == 1
    assert args["trials"] == int(trials)
    assert args["sizes"] == pytest.approx((_percent(small), _percent(large)))
    assert args["factor"] == pytest.approx(float(factor))
    assert not args["no_speedup"] and not args["keep"] and not args["fresh_base"]
    from kernels.bench import gate

    assert args["families"] == list(gate.FAMILIES) and args["ops"] == list(gate.OPS)


@pytest.mark.parametrize("command", ["time", "roofline"])
def test_timing_commands_default_to_the_documented_regime(command):
    (regime,) = _documented(r"The default regime is \*(\w+)\*")
    args = _defaults(command, "softmax")
    assert args["regime"] == regime
    assert args["tags"] is None and args["budget"] is None and not args["mixed_clocks"]
    assert not args["any_size"]


def test_time_and_roofline_default_directions():
    """`time` the forward (the documents: `time softmax --direction fwd bwd` asks for both), the
    roofline both directions (one chart per direction)."""
    assert _defaults("time", "softmax")["direction"] == ["fwd"]
    assert _defaults("roofline", "softmax")["direction"] == ["fwd", "bwd"]
    assert str(_defaults("roofline", "softmax")["out"]) == "traces"


def test_every_option_default_survives_its_own_type():
    """A default given as text goes through the option's type as typed input does (argparse
    converts it), so a default that its own check would refuse cannot hide."""
    parser = _parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for name, command in sub.choices.items():
        for action in command._actions:
            if isinstance(action.default, str) and action.type is not None:
                action.type(action.default)  # raises on a default the option refuses
            if action.choices is not None and action.default is not None:
                values = action.default if isinstance(action.default, list) else \
                    [action.default]
                assert set(values) <= set(action.choices), (name, action.dest)
