"""Writes the learn task family: `train/*.toml`, `heldout/*.toml` and the seed files in `assets/`.

Why: issue 35's loop needs tasks a tiny student can learn from a teacher's
rollouts, and that tell learning from replay. Each prompt names one of four
action families (replace, append, copy, rename) and its values, drawn from
closed sets of file names and words; each task is solved by one shell
command and graded from the workspace files alone (reward 1 or 0).
Held-out tasks use (family, values) combinations never seen in training;
half of them also use a wording never seen in training.

Deterministic (a fixed seed, no clock): `python benchmarks/learn/generate.py`
rewrites the committed files byte for byte; `--out DIR` writes elsewhere.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 35
FILES = ("notes.txt", "todo.txt", "draft.txt", "report.txt", "ideas.txt", "tasks.txt")
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger")
TRAIN_PER_FAMILY, HELDOUT_PER_FAMILY, NEW_WORDING_PER_FAMILY = 10, 4, 2
WORKDIR = "/workspace"  # every rollout's cwd: the harness's prompt names no random temp folder

# family -> (train wordings, held-out-only wordings); {f} a file, {w} a word, {a} -> {b} a source and a target
WORDINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "replace": (("Replace the contents of {f} with the word {w}.", "Replace everything in {f} with the word {w}."),
                ("Please replace what {f} says with just the word {w}.",)),
    "append": (("Append the word {w} to {f}.", "Append the word {w} as a new line at the end of {f}."),
               ("Please append one more line, the word {w}, to {f}.",)),
    "copy": (("Copy {a} to {b}.", "Copy the file {a} to a new file {b}."),
             ("Please copy {a}, keeping it, into {b}.",)),
    "rename": (("Rename {a} to {b}.", "Rename the file {a} so that it is called {b}."),
               ("Please rename {a}; its new name is {b}.",)),
}

GRADERS = {
    "replace": "ok = (ws / {f!r}).is_file() and (ws / {f!r}).read_text() == {w!r} + '\\n'",
    "append": "ok = (ws / {f!r}).is_file() and (ws / {f!r}).read_text() == {seed!r} + {w!r} + '\\n'",
    "copy": "ok = all((ws / n).is_file() and (ws / n).read_text() == {seed!r} for n in ({a!r}, {b!r}))",
    "rename": "ok = not (ws / {a!r}).exists() and (ws / {b!r}).is_file() and (ws / {b!r}).read_text() == {seed!r}",
}


def seed_text(name: str) -> str:
    """What a seeded file holds before the task (every task starts from one)."""
    return f"{name.removesuffix('.txt')} seed line\n"


def combos(family: str) -> list[dict[str, str]]:
    if family in ("replace", "append"):
        return [{"f": f, "w": w} for f, w in itertools.product(FILES, WORDS)]
    return [{"a": a, "b": b} for a, b in itertools.permutations(FILES, 2)]


def covers(chosen: list[dict[str, str]]) -> bool:
    """Every value of every slot appears in `chosen` (values all seen in training, per family and slot)."""
    slots = chosen[0].keys()
    return all({c[s] for c in chosen} == set(FILES if s != "w" else WORDS) for s in slots)


def split(family: str, rng: random.Random) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held-out) combinations: disjoint, train covering every value."""
    while True:
        pool = combos(family)
        rng.shuffle(pool)
        train, heldout = pool[:TRAIN_PER_FAMILY], pool[TRAIN_PER_FAMILY:TRAIN_PER_FAMILY + HELDOUT_PER_FAMILY]
        if covers(train):
            return train, heldout


def task_toml(task_id: str, family: str, values: dict[str, str], prompt: str) -> str:
    seeded = values.get("f") or values["a"]
    check = GRADERS[family].format(seed=seed_text(seeded), **values)
    lines = [f'id = "{task_id}"', f'prompt = "{prompt}"', "timeout_seconds = 300", f'workdir = "{WORKDIR}"', "",
             "[limits]", "cpu_seconds = 300", ""]
    lines += ["[[workspace_files]]", f'source = "../assets/{seeded}"', f'dest = "{seeded}"', ""]
    lines += ["[grading]", "code = '''", "from pathlib import Path", "",
              "def grade(transcript, workspace_path):", "    ws = Path(workspace_path)", f"    {check}",
              '    return {"solved": 1.0 if ok else 0.0}', "'''", ""]
    return "\n".join(lines)


def tasks() -> dict[str, dict[str, str]]:
    """Relative path -> file text, for every file the family consists of (assets included)."""
    rng = random.Random(SEED)
    out = {f"assets/{name}": seed_text(name) for name in FILES}
    for family, (train_wordings, new_wordings) in WORDINGS.items():
        train, heldout = split(family, rng)
        for n, values in enumerate(train):
            prompt = train_wordings[n % len(train_wordings)].format(**values)
            out[f"train/{family}-{n:02d}.toml"] = task_toml(f"learn-train-{family}-{n:02d}", family, values, prompt)
        for n, values in enumerate(heldout):
            wordings = new_wordings if n < NEW_WORDING_PER_FAMILY else train_wordings
            prompt = wordings[n % len(wordings)].format(**values)
            out[f"heldout/{family}-{n:02d}.toml"] = task_toml(f"learn-heldout-{family}-{n:02d}", family, values,
                                                              prompt)
    return out


def write(root: Path) -> None:
    """Replace `root`'s train/, heldout/ and assets/ with the generated files."""
    for folder in ("train", "heldout", "assets"):
        shutil.rmtree(root / folder, ignore_errors=True)
    for rel, text in tasks().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: beside this script)")
    write(parser.parse_args(argv).out)


if __name__ == "__main__":
    main()
