"""``memorywalker inventory``: parameter-state memory of full vs adapter (LoRA) training.

    memorywalker inventory --params 8e9 --layers 32 --shape 4096x4096 --matrices 2 --rank 16
    memorywalker inventory --model ./my-model --rank 16 --target q_proj,v_proj
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("inventory")(inventory_cmd)


def inventory_cmd(
    model: Path = typer.Option(None, "--model", help="HF model dir or config.json (counted on the meta device)"),
    params: float = typer.Option(None, "--params", help="base parameters (without --model), e.g. 8e9"),
    layers: int = typer.Option(1, "--layers", help="layers holding the adapted matrices (without --model)"),
    shape: str = typer.Option("4096x4096", "--shape", help="OUTxIN of each adapted matrix (without --model)"),
    matrices: int = typer.Option(2, "--matrices", help="adapted matrices per layer (without --model)"),
    rank: int = typer.Option(16, "--rank", min=1, help="LoRA rank"),
    target: str = typer.Option("q_proj,v_proj", "--target", help="adapted module names (with --model)"),
) -> None:
    """Parameter-state memory of full vs adapter training (2 weight + 2 grad + 4 master + 8 moments
    bytes per trainable parameter, 2 per frozen one)."""
    from memorywalker.train.inventory import (  # lazy: the command's machinery, only when it runs
        from_model_config,
        inventory,
        lora_parameters,
    )

    if model is not None:
        if not model.exists():
            raise FileNotFoundError(2, "No such file or directory", str(model))
        base, adapter = from_model_config(model, rank, [t for t in target.split(",") if t])
    else:
        if params is None:
            raise typer.BadParameter("give --model DIR or --params N")
        try:
            o, i = (int(x) for x in shape.lower().split("x"))
        except ValueError:
            raise typer.BadParameter(f"--shape {shape!r} is not OUTxIN") from None
        base, adapter = params, lora_parameters([(o, i)] * matrices, rank, layers)
    inv = inventory(base, adapter)
    typer.echo(f"base parameters      {base:,.0f}")
    typer.echo(f"adapter parameters   {adapter:,} ({100 * inv['adapter_fraction']:.2f} %)")
    typer.echo(f"adapter arrays       {inv['adapter_bytes'] / 1e6:.2f} MB (16 B per trainable parameter)")
    typer.echo(f"frozen base          {inv['frozen_bytes'] / 1e9:.2f} GB (2 B per parameter)")
    typer.echo(f"adapter training     {inv['adapter_total_bytes'] / 1e9:.2f} GB")
    typer.echo(f"full training        {inv['full_bytes'] / 1e9:.2f} GB")
    typer.echo(f"full / adapter       {inv['ratio']:.1f}x")
