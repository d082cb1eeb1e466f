"""`all`: the whole chain on builtin:tiny, resuming after a kill in each step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from builds import Built

from moss_gguf_cli.pipeline.run import STEPS


def run_all_cli(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "moss_gguf_cli",
            "all",
            "--model",
            "builtin:tiny",
            "--output",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "160"},
    )


def statuses(stdout: str) -> dict[str, str]:
    """Step → status from the summary table."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.replace("│", "|").split("|") if c.strip()]
        if len(cells) >= 2 and cells[0] in STEPS and cells[1] in ("done", "skipped"):
            found[cells[0]] = cells[1]
    return found


@pytest.fixture(scope="module")
def finished(builds) -> tuple[Path, Built]:
    """README command 1's folder: `all --model builtin:tiny`, shared by the run."""
    built = builds.all("--model", "builtin:tiny")
    return built.path, built


def test_all_builds_a_verified_weights_folder(finished) -> None:
    out, proc = finished  # builds.all has checked its exit status
    # the default engine is the direct one: no intermediate, so no convert step
    assert statuses(proc.stdout) == {**dict.fromkeys(STEPS, "done"), "convert": "skipped"}
    assert "quantized straight from the checkpoint" in proc.stdout
    assert "synth config:" in proc.stdout
    assert (out / "backbone_q4_k_m.gguf").is_file()
    assert len(list((out / "embeddings").glob("*.npy"))) == 33
    assert len(list((out / "lm_heads").glob("*.npy"))) == 33
    config = yaml.safe_load((out / "moss-tts.yaml").read_text())
    assert config["backbone_gguf"] == "backbone_q4_k_m.gguf"
    assert (out / config["audio_decoder_onnx"]).is_file()
    # nothing else is left beside the output: no work folder, no intermediate GGUF
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    assert not list(out.rglob("*f16*.gguf"))


def test_rerun_of_a_finished_run_only_verifies(finished, builds, tmp_path: Path) -> None:
    out = builds.copy(finished[0], tmp_path / "w")
    before = snapshot(out)
    proc = run_all_cli(out)
    assert proc.returncode == 0, proc.stderr
    assert statuses(proc.stdout) == {**dict.fromkeys(STEPS[:-1], "skipped"), "verify": "done"}
    # verified, nothing rewritten but the card, which names this copy's --output
    assert {k: v for k, v in snapshot(out).items() if k != "README.md"} == {
        k: v for k, v in before.items() if k != "README.md"}  # fmt: skip


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file's (size, mtime) under folder: what a refused run must leave as it was."""
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*") if p.is_file()
    }  # fmt: skip


def recipe_with(tmp_path: Path, synth: dict) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model": "builtin:tiny", "synth": synth}))
    return str(path)


@pytest.mark.parametrize(
    "change",
    [
        lambda t, model: ["--model", "builtin:tiny-soundeffect"],
        lambda t, model: ["--model", str(model)],  # the same weights, but a folder
        lambda t, model: ["--outtype", "bf16"],
        lambda t, model: ["--audio-tokenizer", "none"],
        lambda t, model: ["--config", recipe_with(t, {"max_new_tokens": 33})],
    ],
    ids=["other model", "a folder", "outtype", "codec", "recipe"],
)
def test_a_folder_made_from_other_inputs_is_refused(
    finished, change, tmp_path: Path, tiny_model: Path
) -> None:
    out, _ = finished
    before = snapshot(out)
    extra = change(tmp_path, tiny_model)
    args = extra if extra[0] in ("--model", "--config") else ["--model", "builtin:tiny", *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "moss_gguf_cli", "all", *args, "--output", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert str(out) in line and "made from builtin:tiny" in line and "--force" in line, line
    assert snapshot(out) == before  # nothing there changed
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]


def killed_at(held_run, out: Path, step: str) -> None:
    """`all` on builtin:tiny into OUT, killed (SIGKILL) while held at STEP."""
    cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny", "-q"]
    proc = held_run(cmd + ["--output", str(out)], step,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_work_folder_of_other_inputs_is_not_resumed(tmp_path: Path, held_run) -> None:
    out = tmp_path / "w"
    killed_at(held_run, out, "quantize")
    work = tmp_path / ".w.work"
    before = snapshot(work)
    other = run_all_cli(out, "--outtype", "bf16")
    assert other.returncode == 1, other.stderr
    line = other.stderr.strip()
    assert str(work) in line and "outtype 'auto'" in line and "outtype 'bf16'" in line, line
    assert snapshot(work) == before and not out.exists()
    again = run_all_cli(out)  # the same inputs resume it
    assert again.returncode == 0, again.stderr
    assert statuses(again.stdout)["layout"] == "done"


def test_all_fails_when_verify_cannot_run(finished, builds, tmp_path: Path, monkeypatch) -> None:
    """verify that cannot even be imported fails `all`; it is never marked done unrun."""
    from moss_gguf_cli.pipeline.run import AllSettings, run_all

    out = builds.copy(finished[0], tmp_path / "w")
    monkeypatch.setitem(sys.modules, "moss_gguf_cli.verify", None)  # import raises
    with pytest.raises(ImportError):
        run_all(AllSettings(model="builtin:tiny", output=out))


def spoil_a_table(folder: Path) -> None:
    """One value of a written table changed, the file replaced (never written into: its inode
    is linked from the work folder or a shared build); only verify's checks can tell."""
    table = folder / "lm_heads/lm_head_audio_00.npy"
    values = np.load(table)
    values[3, 5] += 1
    spoiled = folder / "spoiled.npy"
    np.save(spoiled, values)
    os.replace(spoiled, table)


def one_line_error(stderr: str) -> str:
    line = stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, stderr
    assert line.startswith("error:") and "verify failed: manifest: " in line, line
    assert "lm_heads/lm_head_audio_00.npy: sha256 mismatch (1 failing check)" in line, line
    return line


def test_a_failing_final_verify_removes_what_the_run_wrote(tmp_path: Path, monkeypatch) -> None:
    """The folder spoiled between layout and verify, at the run's verify hold point: the run
    fails in one line, and nothing it wrote is left, the work folder included."""
    from in_process import moss_gguf

    out = tmp_path / "w"
    (tmp_path / "mine.txt").write_text("not the run's")

    def spoil_at_verify(point: str) -> None:
        if point == "verify":
            spoil_a_table(out)

    monkeypatch.setattr("moss_gguf_cli.pipeline.steps.hold", spoil_at_verify)
    ran = moss_gguf("all", "--model", "builtin:tiny", "--output", str(out), "-q")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    line = one_line_error(ran.stderr)
    assert str(out) in line and "the folder was removed" in line and "-v" in line, line
    assert "moss-gguf verify" not in line  # nothing is left for it to read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    assert (tmp_path / "mine.txt").read_text() == "not the run's"


def test_a_failing_verify_of_a_resumed_run_removes_the_unfinished_folder(
    tmp_path: Path, held_run
) -> None:
    """Killed in verify, its folder spoiled: the rerun only verifies, but the folder never
    passed a verify (its work folder is there), so it is the rerun's to remove."""
    out = tmp_path / "w"
    killed_at(held_run, out, "verify")
    assert (tmp_path / ".w.work").is_dir() and (out / "manifest.json").is_file()
    spoil_a_table(out)
    (tmp_path / "mine.txt").write_text("not the run's")
    rerun = run_all_cli(out, "-q")
    assert rerun.returncode == 1, rerun.stderr
    assert "the folder was removed" in one_line_error(rerun.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_a_failing_verify_leaves_a_finished_runs_folder_as_it_was(
    finished, builds, tmp_path: Path
) -> None:
    """A rerun that only verifies a folder a finished run made removes nothing: this run did
    not write it; the line says so and how to see the report."""
    out = builds.copy(finished[0], tmp_path / "w")
    spoil_a_table(out)
    before = snapshot(out)
    proc = run_all_cli(out, "-q")
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc.stderr)
    assert "left as it was: a finished earlier run made it" in line, line
    assert f"moss-gguf verify {out}" in line and "--force" in line, line
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_unknown_engine_on_a_finished_folder_is_a_one_line_error(finished) -> None:
    from moss_gguf_cli.errors import UsageError
    from moss_gguf_cli.pipeline.run import AllSettings, run_all

    out, _ = finished
    with pytest.raises(UsageError, match="unknown engine 'bogus'") as err:
        run_all(AllSettings(model="builtin:tiny", output=out, engine="bogus"))
    assert "choose auto, direct, binary, library" in err.value.one_line()


def test_keep_intermediate_and_several_file_types(tmp_path: Path) -> None:
    out = tmp_path / "w"  # --file-type, and its old spelling --quant, in one run
    proc = run_all_cli(out, "--file-type", "Q8_0", "--quant", "q6_k", "--keep-intermediate", "-q")
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.glob("*.gguf")} == {"backbone_q8_0.gguf", "backbone_q6_k.gguf"}
    assert (out / "moss-tts.yaml").is_file() and (out / "moss-tts-backbone_q6_k.yaml").is_file()
    kept = tmp_path / "w-intermediate"
    assert (kept / "backbone_f16.gguf").is_file()
    assert (kept / "extracted/qwen3_backbone/model.safetensors").is_file()


def test_other_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "w"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = run_all_cli(out)
    assert proc.returncode == 1 and "--force" in proc.stderr
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]


def test_disk_too_small_stops_before_writing(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=50m", "tmpfs", str(mount)], check=True)
    try:
        proc = run_all_cli(mount / "w")
        assert proc.returncode == 1
        assert "of free disk" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert list(mount.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mount)], check=True)


BACKGROUND = {"extract", "convert", "quantize"}


@pytest.mark.parametrize("step", STEPS)
def test_killed_in_each_step_resumes(step: str, tmp_path: Path, held_run) -> None:
    out = tmp_path / "w"
    # only the two-pass engines have a convert step: the direct one quantizes from the source
    engine = ["--engine", "library"] if step == "convert" else []
    cmd = [sys.executable, "-m", "moss_gguf_cli", "all", "--model", "builtin:tiny", *engine]
    proc = held_run(
        cmd + ["--output", str(out), "-q"], step,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    index = STEPS.index(step)
    if step != "verify":
        assert not (out / "manifest.json").exists()  # nothing there passes for a result

    rerun = run_all_cli(out, *engine)
    assert rerun.returncode == 0, rerun.stderr
    got = statuses(rerun.stdout)
    assert got[step] == "done"
    for i, other in enumerate(STEPS):
        if other in BACKGROUND and step in BACKGROUND:
            # extract runs beside convert and quantize: it may or may not have finished
            assert got[other] in ("done", "skipped"), (other, got)
        else:
            assert got[other] == ("skipped" if i < index else "done"), (other, got)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]
    table = np.load(out / "lm_heads/lm_head_audio_00.npy")
    assert table.shape == (1025, 256) and np.isfinite(table).all()


def test_the_route_is_chosen_once_from_the_input_kind_and_the_formats(tmp_path: Path) -> None:
    """pipeline/route.py's table, and the request checked before anything is looked at."""
    from moss_gguf_cli.errors import UsageError
    from moss_gguf_cli.pipeline.route import (
        AllRequest,
        Backend,
        InputKind,
        Route,
        choose_route,
        find_input,
        run_request,
    )
    from moss_gguf_cli.pipeline.run import AllSettings
    from moss_gguf_cli.progress import RecordingProgress

    backend, first, both = ["backend"], ["moss-tts-delay"], ["backend", "moss-tts-delay"]
    made = {
        InputKind.CHECKPOINT: Backend.STEPS,
        InputKind.PRECONVERTED: Backend.PRECONVERTED,
        InputKind.FIRST_CLASS: Backend.FROM_FIRST_CLASS,
    }
    for kind, how in made.items():
        assert choose_route(kind, backend) == Route(how, first_class=False)
        assert choose_route(kind, both) == Route(how, first_class=True)
        assert choose_route(kind, both).one_read == (kind is InputKind.CHECKPOINT)
    assert choose_route(None, first) == Route(None, first_class=True)
    settings = AllSettings(model="builtin:tiny", output=tmp_path / "w")
    assert find_input(settings, RecordingProgress()).kind is InputKind.CHECKPOINT
    with pytest.raises(UsageError, match="first-class format only"):
        run_request(AllRequest(settings, ["backend"], audio_tables="f16"))
    with pytest.raises(UsageError, match="unknown format 'gguf'"):
        run_request(AllRequest(settings, ["gguf"]))
    assert not (tmp_path / "w").exists()
