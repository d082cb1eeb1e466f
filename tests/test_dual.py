"""`all --format backend --format moss-tts-delay`: both dialects from one read of the checkpoint.

The first-class files must stay the fork's bytes (GOLDEN, tests/test_delay_gguf.py), the
backend files those of `all --format backend` alone; the checkpoint's backbone is read once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from test_all import statuses
from test_delay_gguf import GOLDEN, cli

from moss_gguf_cli.disk.digests import sha256_file
from moss_gguf_cli.gguf.write import OutType
from moss_gguf_cli.pipeline.dual import handoff_dir, run_both
from moss_gguf_cli.pipeline.first_class import run_first_class
from moss_gguf_cli.pipeline.run import AllSettings, run_all
from moss_gguf_cli.progress import RecordingProgress
from moss_gguf_cli.quantize.direct import join_plans, plan_direct, quantize_checkpoint, run_direct
from moss_gguf_cli.quantize.llama import QuantizeSettings
from moss_gguf_cli.source.backbone import open_backbone, plan_native
from moss_gguf_cli.source.checkpoint import open_checkpoint
from moss_gguf_cli.source.first_class import plan_first_class

FIRST = "moss-tts-delay"
# the readers of the checkpoint that the progress counts: the direct pass, convert's
READERS = ("quantize:bytes", "convert:bytes")
WIDE = {**os.environ, "COLUMNS": "200"}


def _rchar() -> int:
    """Bytes this process has read through read(2) (page cache or not)."""
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("rchar:"))


def _source_bytes(progress: RecordingProgress) -> int:
    """What the checkpoint's readers reported reading, over every pass of the run."""
    return sum(e[2] for e in progress.events if e[0] == "advance" and e[1] in READERS)


def test_both_formats_read_the_checkpoint_once(tiny_model: Path, tmp_path: Path) -> None:
    ck = open_checkpoint(tiny_model)
    backbone = sum(r.nbytes for _, r in ck.backbone_tensors())
    whole = plan_first_class(tiny_model).source_bytes  # every tensor the first-class file holds
    assert whole > backbone
    settings = AllSettings(model="builtin:tiny", output=tmp_path / "dual", file_types=["Q4_K_M"])

    # the joint run first: it pays for the imports, so its count is the larger for them
    dual_bar, before = RecordingProgress(), _rchar()
    run_both(settings, progress=dual_bar)
    dual_read = _rchar() - before
    apart_bar, before = RecordingProgress(), _rchar()
    alone = replace(settings, output=tmp_path / "apart")
    run_all(alone, progress=apart_bar)
    run_first_class(replace(alone, output=alone.output / FIRST), progress=apart_bar)
    apart_read = _rchar() - before

    assert _source_bytes(dual_bar) == whole  # every tensor once, the backbone's among them
    assert _source_bytes(apart_bar) == backbone + whole
    # the system's count (all reads: imports, extract, hashing the outputs, verify): the runs
    # one after the other read the backbone a second time (measured: 0.93 x, the imports the
    # joint run paid for among the rest); a second read in the joint run would make it ~0
    assert apart_read - dual_read > 0.5 * backbone, (dual_read, apart_read, backbone)
    for name in ("backbone_q4_k_m.gguf", f"{FIRST}/{FIRST}_q4_k_m.gguf"):
        assert sha256_file(tmp_path / "dual" / name) == sha256_file(tmp_path / "apart" / name)
    assert sha256_file(tmp_path / "dual" / FIRST / f"{FIRST}_q4_k_m.gguf") == GOLDEN["tiny"][
        "Q4_K_M"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["apart", "dual"]  # no hand-off left


def test_the_first_class_float_file_from_the_same_read(tmp_path: Path) -> None:
    """Its F16 file is the pass's kept intermediate, written by position beside the backbone's
    appended files; every byte still the fork's."""
    out = tmp_path / "w"
    done = cli("all", "--model", "builtin:tiny", "--output", str(out), "--format", "backend",
               "--format", FIRST, "--quant", "Q4_K_M", "--quant", "F16",
               "--outtype", "f16")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{FIRST}_q4_k_m.gguf" in done.stdout and "in one read of the checkpoint" in done.stdout
    for q in ("Q4_K_M", "F16"):
        assert sha256_file(out / FIRST / f"{FIRST}_{q.lower()}.gguf") == GOLDEN["tiny"][q]
    checked = cli("verify", str(out / FIRST), "--source", "builtin:tiny")
    assert checked.returncode == 0, checked.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["w"]


def test_a_stopped_run_resumes_from_the_handoff(tmp_path: Path, held_run) -> None:
    out = tmp_path / "w"
    base = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny",
            "--output", str(out), "--format", "backend", "--format", FIRST, "-q"]  # fmt: skip
    proc = held_run(base, "layout", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc.send_signal(signal.SIGKILL)  # the pass is over, the backend folder being laid out
    proc.wait()
    handoff = handoff_dir(out)
    written = handoff / f"{FIRST}_q4_k_m.gguf"
    made = written.stat()
    record = json.loads((handoff / "handoff.json").read_text())
    assert record["made_from"]["format"] == FIRST and record["audio_tables"] is None

    other = subprocess.run([*base, "--audio-tables-type", "f16"], capture_output=True, text=True)
    line = " ".join(other.stderr.split())
    assert other.returncode == 1 and str(handoff) in line and "audio tables None" in line, line
    assert written.stat().st_mtime_ns == made.st_mtime_ns

    again = subprocess.run(base[:-1], capture_output=True, text=True, env=WIDE)
    assert again.returncode == 0, again.stderr
    assert statuses(again.stdout)["quantize"] == "skipped"  # no pass: nothing read again
    final = out / FIRST / f"{FIRST}_q4_k_m.gguf"
    assert final.stat().st_ino == made.st_ino  # the pass's file, moved, not written again
    assert sha256_file(final) == GOLDEN["tiny"]["Q4_K_M"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_a_family_out_of_read_order_is_written_by_position(tiny_model: Path, tmp_path) -> None:
    """The backbone's order is a subsequence of the first-class one, so its files are appended;
    a family whose order is not is written by position, every byte as when made alone."""
    settings = QuantizeSettings()
    first = plan_direct(plan_first_class(tiny_model, "f16"), [(tmp_path / "first.gguf", "Q4_K_M")],
                        settings, None, tmp_path)  # fmt: skip
    backbone = plan_native(open_backbone(open_checkpoint(tiny_model)), OutType.parse("f16"))
    back = plan_direct(backbone, [(tmp_path / "back.gguf", "Q6_K")], settings, None, tmp_path)
    in_order = join_plans([first, back])
    assert [t.positional for t in in_order.targets] == [False, False]
    back.tensors.reverse()  # as if this family were read the other way round
    joint = join_plans([first, back])
    assert [t.positional for t in joint.targets] == [False, True]
    assert [t.name for t in joint.tensors] == [t.name for t in first.tensors]
    run_direct(joint)
    alone = tmp_path / "alone"
    quantize_checkpoint(tiny_model, [(alone / "back.gguf", "Q6_K")], "f16", settings, None, alone)
    assert sha256_file(tmp_path / "back.gguf") == sha256_file(alone / "back.gguf")
    assert sha256_file(tmp_path / "first.gguf") == GOLDEN["tiny"]["Q4_K_M"]


def test_a_first_class_folder_not_ours_is_refused_before_any_work(tmp_path: Path) -> None:
    mine = tmp_path / "w" / FIRST / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("mine")
    done = cli("all", "--model", "builtin:tiny", "--output", str(tmp_path / "w"),
               "--format", "backend", "--format", FIRST)  # fmt: skip
    line = " ".join(done.stderr.split())
    assert done.returncode == 1 and "output folder exists and is not empty" in line, line
    assert str(mine.parent) in line
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "w", f"w/{FIRST}", f"w/{FIRST}/notes.txt"
    ]  # no backend work, no hand-off
