"""Sampling inside a ggml graph, by the rule of tts/sampling.pick_one: a family's frame graph
(nano/ggml_local.py, realtime/depth.py) samples each position where it computes it, so a
frame is one graph call and not a Python round trip a position.

`penalised`: the repetition penalty over a SEEN mask (1.0 where a code counts as seen).
`sample`: greedy (argmax) or temperature, top-k, softmax, top-p over the mass strictly ahead,
then the first candidate whose cumulative mass exceeds draw × the kept mass (ties in logit
order broken by ggml's sort, not by id). A token can differ from float64 NumPy's only where a
draw falls within float32 rounding of a boundary.
May import: graphs/ and tts/sampling.
"""

from __future__ import annotations

from ..graphs import GgmlType, Graph, SortOrder, Tensor
from .sampling import SamplingParams


def penalised(g: Graph, logits: Tensor, seen: Tensor, params: SamplingParams,
              at: str) -> Tensor:  # fmt: skip
    """pick_one's penalty: a seen code's logit / penalty where positive, × penalty
    otherwise, as logit + seen × (logit × (penalty - 1) + relu(logit) × (1/penalty -
    penalty))."""
    penalty = params.repetition_penalty
    if penalty == 1.0:
        return logits
    change = g.add(g.scale(logits, penalty - 1.0, name=f"{at}.pen_all"),
                   g.scale(g.relu(logits, name=f"{at}.pen_relu"), 1.0 / penalty - penalty,
                           name=f"{at}.pen_positive"), name=f"{at}.pen_change")  # fmt: skip
    return g.add(logits, g.mul(change, seen, name=f"{at}.pen_seen"), name=f"{at}.penalised")


def sample(g: Graph, logits: Tensor, params: SamplingParams, draw: Tensor,
           at: str) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(pick [1] int32, check [1]) of LOGITS [vocab] by pick_one's rule with DRAW [1]."""
    vocab = logits.nelements
    rows = g.reshape(logits, (1, vocab), name=f"{at}.logit_rows")  # a value a row
    if params.greedy:
        pick = g.argmax(g.reshape(logits, (vocab, 1), name=f"{at}.logit_row"),
                        name=f"{at}.pick")  # fmt: skip
        return pick, g.reshape(g.get_rows(rows, pick, name=f"{at}.picked_logit"), (1,),
                               name=f"{at}.check")  # fmt: skip
    k = params.top_k if 0 < params.top_k < vocab else vocab
    ids = g.top_k(logits, k, name=f"{at}.top_ids")  # in no order
    values = g.get_rows(rows, ids, name=f"{at}.top_values")  # [1, k]
    order = g.argsort(g.reshape(values, (k,), name=f"{at}.top_flat"), SortOrder.DESC,
                      name=f"{at}.order")  # fmt: skip
    # the ids in the order of their values: [1, k] int32
    ids = g.get_rows(g.reshape(ids, (1, k), name=f"{at}.id_rows"), order,
                     name=f"{at}.sorted_ids")  # fmt: skip
    values = g.reshape(g.get_rows(values, order, name=f"{at}.sorted_rows"), (k,),
                       name=f"{at}.sorted")  # fmt: skip
    probs = g.soft_max(values, scale=1.0 / params.temperature, name=f"{at}.probs")
    if params.top_p < 1.0:  # kept where the mass strictly ahead is below top_p
        ahead = g.sub(g.cumsum(probs, name=f"{at}.mass"), probs, name=f"{at}.ahead")
        room = g.scale_bias(ahead, -1.0, params.top_p, name=f"{at}.room")
        probs = g.mul(probs, g.step(room, name=f"{at}.in_top_p"), name=f"{at}.top_p")
    cumulative = g.cumsum(probs, name=f"{at}.cumulative")
    kept = g.view(cumulative, (1,), offset=k - 1, name=f"{at}.kept")
    point = g.mul(draw, kept, name=f"{at}.point")
    # how many cumulative masses are <= the point: k minus those above it, at most k - 1
    beyond = g.step(g.sub(cumulative, point, name=f"{at}.past_point"), name=f"{at}.beyond")
    above = g.sum(beyond, name=f"{at}.above")
    index = g.clamp(g.scale_bias(above, -1.0, float(k), name=f"{at}.below"), 0.0,
                    float(k - 1), name=f"{at}.index")  # fmt: skip
    pick = g.get_rows(ids, g.cast(index, GgmlType.I32, name=f"{at}.index_i32"),
                      name=f"{at}.picked")  # fmt: skip
    return g.reshape(pick, (1,), name=f"{at}.pick"), kept
