"""Every command the docs show parses: `dflash ...`, `python -m dflash ...`, `docker run ...`
and `podman run ...` (the part after the image is dflash's arguments: the entrypoint is
already `dflash`), `torchrun ...` (torchrun's own parser, then dflash's) and `just ...`
(the recipe exists with that many arguments, and what it forwards to dflash parses);
`uv run [options]` in front of any of them is dropped.

Commands come from the code blocks (fenced and indented) of README.md and docs/*.md,
read with a CommonMark parser. `dflash train` lines are also resolved into a TrainConfig,
so their values validate; only the local paths they name (models, data) are not checked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from dflash import train_cli
from dflash.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATORS = {";", "&&", "||", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>"}
# `docker run` / `podman run` options that take no value; every other option takes one.
ENGINE_SWITCHES = {"--rm", "-d", "--detach", "-i", "-t", "-it", "-ti", "--interactive"}
ENGINE_SWITCHES |= {"--tty", "--init", "--privileged", "--read-only", "--replace"}
IMAGE = re.compile(r"^(IMAGE|(localhost/)?dflash(:[\w.-]+)?)$")


def code_lines(path: Path):
    """(line number, shell line) of every code block, backslash continuations joined."""
    for token in MarkdownIt().parse(path.read_text()):
        if token.type not in ("fence", "code_block") or token.map is None:
            continue
        if token.type == "fence" and token.info.strip() not in ("", "bash", "sh", "shell"):
            continue
        start, pending = token.map[0] + (token.type == "fence"), ""
        for i, line in enumerate(token.content.splitlines()):
            if not pending:
                first = start + i + 1
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            yield first, pending
            pending = ""


def split_commands(line: str) -> list[list[str]]:
    """Simple commands of one shell line: comments, redirections and `...` dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lex.whitespace_split = True
    commands, words, tokens = [], [], list(lex)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in SEPARATORS:
            commands.append(words)
            words = []
        elif tok in REDIRECTS:
            i += 1  # the file
        elif tok != "...":
            words.append(tok)
        i += 1
    commands.append(words)
    # Leading VAR=value assignments belong to the shell, not the command.
    return [
        c[next((j for j, w in enumerate(c) if not re.match(r"^\w+=", w)), len(c)) :]
        for c in commands
    ]


def documented():
    for path in DOCS:
        for lineno, line in code_lines(path):
            for words in map(without_uv_run, split_commands(line)):
                if kind(words):
                    yield pytest.param(words, id=f"{path.name}:{lineno}:{' '.join(words)[:60]}")


def without_uv_run(words: list[str]) -> list[str]:
    """`uv run [options] COMMAND ...` -> `COMMAND ...`."""
    if words[:2] != ["uv", "run"]:
        return words
    rest = words[2:]
    while rest and rest[0].startswith("-"):
        rest = rest[1:]
    return rest


def kind(words: list[str]) -> str | None:
    if not words:
        return None
    head = Path(words[0]).name
    if head == "dflash":  # `dflash eval: RUN/...: message` is a message the docs quote
        return None if words[1:2] and words[1].endswith(":") else "dflash"
    if head.startswith("python") and words[1:3] == ["-m", "dflash"]:
        return "python"
    if head in ("docker", "podman") and words[1:2] == ["run"]:
        return "engine"
    if head == "torchrun":
        return "torchrun"
    if head == "just":
        return "just"
    return None


def parse_dflash(argv: list[str]) -> None:
    """dflash's own parser (exit 0 for --help); `train` lines also build a TrainConfig."""
    assert argv, "no dflash subcommand"
    if argv[0] in ("-h", "--help"):
        return
    assert argv[0] in COMMANDS, f"unknown dflash subcommand {argv[0]!r}; one of {list(COMMANDS)}"
    module = importlib.import_module(COMMANDS[argv[0]][0])
    parser = argparse.ArgumentParser(prog=f"dflash {argv[0]}", exit_on_error=False)
    module.add_arguments(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(argv[1:])
    except SystemExit as e:
        assert e.code == 0, f"dflash {' '.join(argv)}: {err.getvalue().strip()}"
        return
    except argparse.ArgumentError as e:
        raise AssertionError(f"dflash {' '.join(argv)}: {e}") from None
    if argv[0] == "train" and not args.show_recipe:
        if args.config is None and all(
            v is None for k, v in vars(args).items() if not k.startswith("_")
        ):
            args.config = "tiny"  # what a bare `dflash train` runs
        train_cli.resolve(args)


@pytest.fixture(autouse=True)
def _no_local_paths(monkeypatch, tmp_path):
    """Models and data named in the docs are not on this machine; runs are not started."""
    monkeypatch.setattr(train_cli, "check_local_paths", lambda cfg: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def engine_args(words: list[str]) -> list[str]:
    """The arguments after the image of a `docker run` / `podman run` line."""
    i = 2
    while i < len(words) and words[i].startswith("-"):
        i += 1 if words[i] in ENGINE_SWITCHES or "=" in words[i] else 2
    assert i < len(words), f"no image in {' '.join(words)}"
    assert IMAGE.match(words[i]), f"{words[i]!r} is not a dflash image (or IMAGE)"
    rest = words[i + 1 :]
    assert rest[:1] != ["dflash"], "the image's entrypoint is already `dflash`: drop the word"
    return rest or ["doctor"]  # the image's CMD


@cache
def just_recipes() -> dict:
    just = shutil.which("just")
    assert just, "just is needed to read the Justfile (CI installs it)"
    out = subprocess.run(
        [just, "--dump", "--dump-format", "json"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["recipes"]


def check_just(args: list[str]) -> None:
    recipes = just_recipes()
    options = [a for a in args if a.startswith("-")]
    assert not options or args.index(options[0]) > 0, f"just option {options[0]} not checked"
    name = args[0] if args else "default"
    assert name in recipes, f"no Justfile recipe {name!r}; recipes: {sorted(recipes)}"
    recipe, given = recipes[name], args[1:]
    params = recipe["parameters"]
    variadic = [p for p in params if p["kind"] in ("star", "plus")]
    fixed = [p for p in params if p["kind"] == "singular"]
    required = [p for p in fixed if p["default"] is None]
    assert len(given) >= len(required) + sum(p["kind"] == "plus" for p in variadic), (
        f"just {name} needs {[p['name'] for p in required]}"
    )
    assert variadic or len(given) <= len(fixed), f"just {name} takes {len(fixed)} arguments"
    # A recipe that forwards its arguments to a dflash subcommand: they must parse there.
    for line in recipe["body"]:
        text = "".join(f if isinstance(f, str) else "{{}}" for f in line)
        m = re.search(r"\bdflash ((?:[a-z-]+ )*)\{\{\}\}\s*$", text)
        if m and not fixed:
            parse_dflash(m.group(1).split() + given)


@pytest.mark.parametrize("words", list(documented()))
def test_documented_command_parses(words):
    what = kind(words)
    if what == "dflash":
        parse_dflash(words[1:])
    elif what == "python":
        assert importlib.util.find_spec("dflash.__main__"), "python -m dflash needs __main__"
        parse_dflash(words[3:])
    elif what == "engine":
        parse_dflash(engine_args(words))
    elif what == "torchrun":
        from torch.distributed.run import get_args_parser

        args = get_args_parser().parse_args(words[1:])
        assert args.module and args.training_script in ("dflash", "dflash.cli"), (
            "torchrun must run `-m dflash` (dflash's own command line)"
        )
        parse_dflash(args.training_script_args)
    else:
        check_just(words[1:])


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds what it should: if it silently found nothing, every
    documented command could break unnoticed."""
    kinds = {kind(p.values[0]) for p in documented()}
    assert {"dflash", "engine", "torchrun", "just"} <= kinds


def test_a_wrong_command_is_caught():
    with pytest.raises(AssertionError, match="entrypoint is already `dflash`"):
        engine_args(["docker", "run", "--gpus", "all", "IMAGE", "dflash", "train"])
    with pytest.raises(AssertionError, match="unrecognized arguments: --nope"):
        parse_dflash(["doctor", "--nope"])
    with pytest.raises(ValueError, match="--max-steps must be > 0"):
        parse_dflash(["train", "--max-steps", "0"])
    with pytest.raises(AssertionError, match="no Justfile recipe 'nope'"):
        check_just(["nope"])
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        check_just(["train", "--no-such-flag"])
