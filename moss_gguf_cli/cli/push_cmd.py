"""`moss-gguf push`: a finished output folder to a Hugging Face repo, in one commit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..disk.staging import human_bytes
from ..pipeline.push import PushPlan, PushResult, plan_push, push
from ._command import command
from ._options import Quiet, Verbose
from ._output import OutputMode, info, progress_for, setup_logging, stdout

EXAMPLES = """
[b]Examples[/b]

  moss-gguf push weights/MOSS-TTS-Q4_K_M you/MOSS-TTS-Q4_K_M-GGUF --dry-run

  moss-gguf push weights/MOSS-TTS-Q4_K_M you/MOSS-TTS-Q4_K_M-GGUF --private

  moss-gguf push weights/MOSS-TTS-Q4_K_M you/MOSS-TTS-Q4_K_M-GGUF --create-pr

Every file's sha256 is checked against manifest.json first; a folder that differs is refused.
The token comes from HF_TOKEN or `hf auth login`. Files the repo already holds with the same
content are not sent again; the rest go up in one commit.
"""


@command("push", help="Upload a finished output folder to the Hugging Face Hub.", epilog=EXAMPLES)
def push_command(
    folder: Annotated[Path, typer.Argument(help="The folder `moss-gguf all` wrote.")],
    repo_id: Annotated[str, typer.Argument(help="The Hub repo, OWNER/NAME (created if new).")],
    private: Annotated[bool, typer.Option(help="Create the repo private.")] = False,
    revision: Annotated[
        str | None, typer.Option(help="The branch to commit to (created if new; default main).")
    ] = None,
    create_pr: Annotated[
        bool, typer.Option(help="Open a pull request with the commit instead of committing.")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(help="Check the folder and list what would be sent; no token, no network."),
    ] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
) -> None:
    mode = OutputMode(quiet=quiet, verbose=verbose)
    setup_logging(mode)
    with progress_for(mode) as bar:
        plan = plan_push(folder, repo_id, bar)
        if not dry_run:
            result = push(plan, private=private, revision=revision, create_pr=create_pr,
                          progress=bar)  # fmt: skip
    if dry_run:
        _dry_run(plan)
        return
    _summary(result, mode)


def _dry_run(plan: PushPlan) -> None:
    for f in plan.files:  # plain lines, path TAB size: for a reader and for a script
        typer.echo(f"{f.path}\t{human_bytes(f.size)}")
    stdout.print(f"dry run: {len(plan.files)} files would go to {plan.repo_id}; nothing sent",
                 highlight=False, soft_wrap=True)  # fmt: skip


def _summary(result: PushResult, mode: OutputMode) -> None:
    for path in result.kept:
        info(mode, f"already on the Hub: {path}")
    if result.commit_url is None:
        stdout.print(f"{result.repo_id}: every file is already there; nothing sent, no commit",
                     highlight=False, soft_wrap=True)  # fmt: skip
        return
    stdout.print(f"{len(result.sent)} files sent, {len(result.kept)} already there, in one "
                 f"commit: {result.commit_url}", highlight=False, soft_wrap=True)  # fmt: skip
    if result.pr_url:
        stdout.print(f"pull request: {result.pr_url}", highlight=False, soft_wrap=True)
