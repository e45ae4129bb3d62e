"""Run recipes: TOML files whose keys are TrainConfig's fields.

`dflash train --config FILE` (or ./dflash.toml in the working directory) reads one;
flags override its values. The shipped recipes live next to this file, inside the
package, so they exist wherever dflash is installed (a wheel, the image's /opt/venv):
`--config tiny`, `--config qwen3-8b.toml` and `--config recipes/tiny.toml` name them
when no such file exists in the working directory. Values are validated by TrainConfig
itself; this module only reads the file and checks that every key is a field.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash.config import TrainConfig

RECIPE_FILE = "dflash.toml"  # read from the working directory when --config is absent
SHIPPED_DIR = Path(__file__).parent
# A recipe names values, not another recipe.
KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "config")


class RecipeError(ValueError):
    pass


@dataclass(frozen=True)
class Recipe:
    path: Path
    sha256: str
    values: dict[str, Any]
    shipped: str | None  # the shipped recipe's name, or None for a user's file

    def record(self) -> dict[str, Any]:
        """What run.json keeps about the recipe a run was started from."""
        return {"path": str(self.path), "sha256": self.sha256, "shipped": self.shipped}


def shipped() -> dict[str, Path]:
    """Shipped recipe name -> file."""
    return {p.stem: p for p in sorted(SHIPPED_DIR.glob("*.toml"))}


def resolve(spec: str) -> Path:
    """A file path, or the name of a shipped recipe (`tiny`, `tiny.toml`, `recipes/tiny.toml`)."""
    path = Path(spec)
    if path.is_file():
        return path.resolve()
    name = path.name.removesuffix(".toml")
    if path.parent in (Path("."), Path("recipes")) and name in shipped():
        return shipped()[name]
    raise RecipeError(
        f"{spec}: no such recipe file; shipped recipes: {', '.join(shipped())} (e.g. --config tiny)"
    )


def load(spec: str) -> Recipe:
    path = resolve(spec)
    blob = path.read_bytes()
    try:
        values = tomllib.loads(blob.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise RecipeError(f"{path}: not valid TOML: {e}") from None
    for key, value in values.items():
        if key not in KEYS:
            close = difflib.get_close_matches(key.replace("-", "_"), KEYS, n=3)
            hint = (
                f"did you mean {' or '.join(close)}?" if close else f"valid keys: {', '.join(KEYS)}"
            )
            raise RecipeError(f"{path}: unknown key {key!r}; {hint}")
        if isinstance(value, (dict, list)):
            raise RecipeError(f"{path}: key {key!r} must be a single value, got {value!r}")
    name = path.stem if path.parent == SHIPPED_DIR else None
    return Recipe(path, hashlib.sha256(blob).hexdigest(), values, name)


def text(name: str) -> str:
    """A shipped recipe's text (`dflash train --show-recipe NAME`)."""
    return resolve(name).read_text()
