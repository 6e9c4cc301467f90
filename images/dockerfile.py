"""Read a Dockerfile into (INSTRUCTION, arguments) pairs, for the image tests.

``tests/unit/helm/test_images.py`` checks what each Dockerfile installs against
``pyproject.toml``; ``tests/integration/test_helm_images.py`` runs the operator image's builder
stage in a local virtualenv (no Docker engine exists here). Comments and blank lines are
dropped and ``\\``-continued lines joined; heredocs and parser directives other than comments
are not supported (the project's Dockerfiles use neither).
"""

from __future__ import annotations

from pathlib import Path

IMAGES = Path(__file__).resolve().parent


def instructions(image: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of ``images/<image>/Dockerfile`` in order."""
    text = (IMAGES / image / "Dockerfile").read_text()
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if not current and (line.lstrip().startswith("#") or not line.strip()):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        word, _, rest = (current + line).strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    return out


def stages(image: str) -> list[list[tuple[str, str]]]:
    """The instructions grouped by build stage (each list starts with its FROM)."""
    groups: list[list[tuple[str, str]]] = []
    for word, args in instructions(image):
        if word == "FROM":
            groups.append([])
        if groups:
            groups[-1].append((word, args))
    return groups
