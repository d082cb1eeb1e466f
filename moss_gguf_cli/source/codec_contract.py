"""The audio tokenizer's contract (docs/ARCHITECTURE.md §5), checked on its ONNX graphs.

``decoder.onnx``: (codes int64 (32, B, T), n_quantizers int64 scalar) → (audio float32
(B, 1, samples), lengths); ``encoder.onnx`` the reverse. Inputs and outputs are taken by
position, since their names may be auto-generated. `check_graph_file` reads the contract from
the graph alone (its external weights are not loaded): what `all` checks a codec folder with
before the long work (source/audio_tokenizer.py); tts/codec.py checks a loaded session with
`check_signature`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError

Arg = tuple[str, "list | None"]  # ("tensor(int64)", shape or None)


def check_signature(ins: list[Arg], outs: list[Arg], path: Path, role: str) -> None:
    """The contract above for one graph, from its (type, shape) inputs and outputs."""
    if role == "decoder":
        expected = "(codes int64 [32,B,T], n_quantizers int64) → (audio float [B,1,N], lengths)"
        first_in, first_out = ("tensor(int64)", 3), ("tensor(float)", 3)
    else:
        expected = "(audio float [B,1,N], n_quantizers int64) → (codes int64 [32,B,T], lengths)"
        first_in, first_out = ("tensor(float)", 3), ("tensor(int64)", 3)

    def fits(arg: Arg, kind: tuple[str, int]) -> bool:
        return arg[0] == kind[0] and (arg[1] is None or len(arg[1]) == kind[1])

    ok = (
        len(ins) == 2
        and len(outs) >= 1
        and fits(ins[0], first_in)
        and ins[1][0] == "tensor(int64)"
        and (ins[1][1] is None or len(ins[1][1]) <= 1)
        and fits(outs[0], first_out)
    )
    if not ok:
        found = ", ".join(f"{t}{list(sh or [])}" for t, sh in ins)
        found += " → " + ", ".join(f"{t}{list(sh or [])}" for t, sh in outs)
        raise InputError(
            f"the audio {role} has the wrong signature: {found}",
            path=path,
            hint=f"expected {expected}",
        )


def check_graph_file(path: Path, role: str) -> None:
    """The contract, read from the .onnx graph alone (its external weights are not loaded)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends
        raise InputError(
            f"not a readable ONNX {role}: {str(exc).splitlines()[0] if str(exc) else exc}",
            path=path,
            hint="download the audio tokenizer again",
        ) from exc
    graph = model.graph
    weights = {t.name for t in graph.initializer}

    def arg(v) -> Arg:
        t = v.type.tensor_type
        name = onnx.TensorProto.DataType.Name(t.elem_type).lower()
        dims = t.shape.dim if t.HasField("shape") else None
        shape = [d.dim_param or d.dim_value for d in dims] if dims is not None else None
        return (f"tensor({name})", shape)

    ins = [arg(v) for v in graph.input if v.name not in weights]
    outs = [arg(v) for v in graph.output]
    check_signature(ins, outs, path, role)
