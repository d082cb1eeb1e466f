"""`moss-gguf quantize`: quantize the f16 GGUF with llama.cpp (binary or in-process libllama)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..disk.staging import human_bytes
from ..doctor import preflight, quantize_bytes
from ..errors import UsageError
from ..gguf.file_types import parse_file_type
from ..quantize.engines import Engine
from ..quantize.llama import QuantizeSettings, plan_quantize, quantize
from ._command import command
from ._options import Force, LlamaCppDir, Quiet, Verbose
from ._output import OutputMode, info, progress_for, setup_logging, stderr

EXAMPLES = """
[b]Examples[/b]

  moss-gguf quantize weights/backbone_f16.gguf weights/backbone_q4km.gguf Q4_K_M

  moss-gguf quantize weights/backbone_f16.gguf --type Q4_K_M --type Q8_0 --output-dir weights
  [dim](writes weights/backbone_q4_k_m.gguf and weights/backbone_q8_0.gguf)[/dim]

  moss-gguf quantize backbone_f16.gguf out.gguf q6_k --engine library --threads 4

  moss-gguf quantize backbone_f16.gguf out.gguf Q4_K_M --dry-run

[b]Output names[/b] (--output-dir, or no OUTPUT): the input name without its float
suffix (_f16, -bf16, .f32 …) plus _type: backbone_f16.gguf → backbone_q4_k_m.gguf.
Without --output-dir they go beside the input.

[b]Engines[/b]: [i]binary[/i] runs llama-quantize from --llama-cpp DIR, $LLAMA_CPP_DIR
or PATH (scripts/get-llama-cpp.sh builds one). [i]library[/i] calls llama_model_quantize
in llama-cpp-python's libllama, no llama.cpp tree needed. [i]auto[/i] takes the binary
when found, else the library.
"""


@command(
    "quantize",
    help="Quantize a GGUF with llama.cpp (Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ…, any llama.cpp "
    "file type, case-insensitive). Guide form: INPUT OUTPUT TYPE; several types: "
    "--type … --output-dir DIR.",
    epilog=EXAMPLES,
)
def quantize_command(
    input: Annotated[Path, typer.Argument(help="The f16/bf16/f32 GGUF to quantize.")],
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="OUTPUT file and/or TYPE (the guide's form: INPUT OUTPUT TYPE).",
            metavar="[OUTPUT] [TYPE]",
            show_default=False,
        ),
    ] = None,
    file_types: Annotated[
        list[str] | None,
        typer.Option(
            "--type", "-t", "--file-type", help="The file type; repeat for several outputs."
        ),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Folder for outputs named after the type."),
    ] = None,
    engine: Annotated[
        str, typer.Option(help="binary (llama-quantize), library (libllama) or auto.")
    ] = Engine.AUTO.value,
    llama_cpp: LlamaCppDir = None,
    imatrix: Annotated[
        Path | None, typer.Option(help="Importance matrix file (from llama-imatrix).")
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="Threads (default: all cores).", min=1)
    ] = None,
    token_embedding_type: Annotated[
        str | None, typer.Option(help="Tensor type for token_embd, e.g. q8_0.")
    ] = None,
    output_tensor_type: Annotated[
        str | None, typer.Option(help="Tensor type for the output head, e.g. q8_0.")
    ] = None,
    allow_requantize: Annotated[
        bool,
        typer.Option(
            "--allow-requantize", help="Allow an already-quantized input (loses quality)."
        ),
    ] = False,
    pure: Annotated[
        bool, typer.Option("--pure", help="No k-quant mixture: every tensor gets TYPE.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and print the llama-quantize commands only.")
    ] = False,
    force: Force = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    output, types = _split_args(args or [], file_types or [])
    kw = dict(
        engine=engine, llama_cpp=llama_cpp, imatrix=imatrix, threads=threads, pure=pure,
        token_embedding_type=token_embedding_type, output_tensor_type=output_tensor_type,
        allow_requantize=allow_requantize,
    )  # fmt: skip
    if dry_run:
        s = QuantizeSettings(**kw)
        _, jobs = plan_quantize(
            input, output, types, output_dir=output_dir, settings=s, force=force
        )
        for job in jobs:
            if job.engine is Engine.LIBRARY:
                typer.echo("# library engine: llama_model_quantize in-process, same as:")
            typer.echo(shlex.join(job.command))
        return
    # doctor's pre-flight (here, not in core quantize(): library callers get no probe child
    # or cache writes): engine, llama.cpp runtime when libllama quantizes, the output's disk
    info, jobs = plan_quantize(
        input, output, types, output_dir=output_dir, settings=QuantizeSettings(**kw), force=force
    )
    preflight(
        needs_quantize=True,
        output=jobs[0].output,
        needed_bytes=quantize_bytes(info.n_elements, [j.file_type for j in jobs]),
        llama_cpp=llama_cpp,
        engine=engine,
    )
    with progress_for(mode) as bar:
        results = quantize(
            input, output, types, output_dir=output_dir, force=force, progress=bar, **kw
        )
    if not mode.quiet:
        _summary(results, mode)
    for r in results:
        typer.echo(str(r.output))


def _split_args(args: list[str], types: list[str]) -> tuple[Path | None, list[str]]:
    """INPUT OUTPUT TYPE (the guide), INPUT TYPE, INPUT OUTPUT --type T, INPUT --type T…"""
    if len(args) > 2:
        raise UsageError("too many arguments", hint="INPUT [OUTPUT] [TYPE]")
    output: Path | None = None
    rest = list(args)
    if len(rest) == 2:
        output, types = Path(rest[0]), [rest[1], *types]
    elif len(rest) == 1:
        if rest[0].lower().endswith(".gguf") or "/" in rest[0]:
            output = Path(rest[0])
        else:
            parse_file_type(rest[0])  # not a path: it must be a type (or an error listing them)
            types = [rest[0], *types]
    if not types:
        raise UsageError("no quantization type given", hint="e.g. `INPUT OUTPUT Q4_K_M`")
    return output, types


def _summary(results: list, mode: OutputMode) -> None:
    table = Table(title="quantize", title_justify="left", show_edge=False)
    for col in ("type", "output", "size", "BPW", "time", "tensor types", "fallbacks"):
        right = col in ("size", "BPW", "time", "fallbacks")
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in results:
        table.add_row(
            r.file_type,
            str(r.output),
            f"{human_bytes(r.input_bytes)} → {human_bytes(r.output_bytes)}",
            f"{r.input_bpw:.2f} → {r.bpw:.2f}",
            f"{r.seconds:.1f} s",
            " ".join(f"{t}×{n}" for t, n in r.type_counts.most_common()),
            str(len(r.fallbacks)),
        )
    stderr.print(table)
    for r in results:
        if r.fallbacks:
            moved = ", ".join(f"{f.name} {f.wanted_type}→{f.used_type}" for f in r.fallbacks)
            info(mode, f"{r.file_type}: {len(r.fallbacks)} tensor(s) needed a fallback type "
                 f"(row length not a multiple of the block size): {moved}")  # fmt: skip
    engines = sorted({f"{r.engine} ({r.llama_cpp})" for r in results})
    info(mode, f"engine: {'; '.join(engines)}")
