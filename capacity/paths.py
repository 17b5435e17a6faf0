"""Where the shipped data lives.

`hw_profiles/` and `scenarios/` sit at the top of the repository. A regular `pip install .`
copies them into the installed package (see pyproject.toml); an editable install or a source
checkout reads them from the repository.
"""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    installed = _PACKAGE / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def hw_profiles_dir() -> Path:
    return _shipped("hw_profiles")


def scenarios_dir() -> Path:
    return _shipped("scenarios")


def data_dir() -> Path:
    return _PACKAGE / "data"
