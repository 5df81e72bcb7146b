"""``torch.compile`` with the layer inside (``modules/custom_op.py``): an inference
graph holds it as one custom op, no break; training keeps a break and its backward."""

import contextlib
import copy
import gc
import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from torch import nn

from core.config import MoEConfig
from core.errors import ConfigError
from modules import Int4MoE, custom_op
from modules.custom_op import STATE, forward_op
from tests.tolerances import EXACT

CFG = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32)


def _layer(generator: torch.Generator) -> Int4MoE:
    e, d, f = CFG.num_experts, CFG.hidden_size, CFG.intermediate_size
    return Int4MoE.from_float(
        w13_weight=torch.randn(e, 2 * f, d, generator=generator) / d**0.5,
        w2_weight=torch.randn(e, d, f, generator=generator) / f**0.5,
        config=CFG,
        gate_weight=torch.randn(e, d, generator=generator),
        dtype=torch.float32,
    )


def _graph_targets(model: nn.Module, x: torch.Tensor) -> list[str]:
    """The call targets of the one graph Dynamo makes of ``model(x)`` (fullgraph)."""
    targets: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        del inputs
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, fullgraph=True, backend=backend)(x)
    return targets


def test_inference_graph_holds_the_layer_as_one_op(generator: torch.Generator) -> None:
    model = nn.Sequential(nn.Linear(64, 64), _layer(generator), nn.Linear(64, 64))
    x = torch.randn(2, 5, 64, generator=generator)
    with torch.no_grad():
        targets = _graph_targets(model, x)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        for tokens in (5, 9, 1, 0):  # recompiles with a dynamic token count
            x = torch.randn(2, tokens, 64, generator=generator)
            torch.testing.assert_close(compiled(x), model(x), **EXACT)
    assert sum("int4_moe.forward" in t for t in targets) == 1


def test_each_layer_and_each_copy_runs_its_own_weights(
    generator: torch.Generator,
) -> None:
    """The graph passes each layer's tensors; a deep copy has tensors of its own."""
    first = _layer(generator)
    second = copy.deepcopy(first)
    assert second.op_state()[0] is not first.op_state()[0]
    with torch.no_grad():
        second.get_buffer("w2_scale").mul_(2.0)  # in place: the copy computes 2x
    second.invalidate_prepared()
    model = nn.Sequential(first, second)
    x = torch.randn(3, 64, generator=generator)
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
        torch.testing.assert_close(compiled, model(x), **EXACT)
        torch.testing.assert_close(second(x), 2 * first(x), rtol=1e-5, atol=1e-6)


# Dynamo itself reads .grad of the non-leaf input while tracing ``requires_grad``
# (torch 2.13), which warns; the suite turns warnings into errors.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_training_keeps_a_graph_break_and_the_backward(
    generator: torch.Generator,
) -> None:
    moe = _layer(generator)
    model = nn.Sequential(nn.Linear(64, 64), moe)
    x = torch.randn(4, 64, generator=generator)
    torch.autograd.backward(model(x).sum())
    expected = [p.grad.clone() for p in model[0].parameters() if p.grad is not None]
    model.zero_grad()
    torch._dynamo.reset()
    torch.autograd.backward(torch.compile(model, backend="aot_eager")(x).sum())
    got = [p.grad for p in model[0].parameters() if p.grad is not None]
    assert len(got) == len(expected) == 2
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_op_passes_torch_opcheck(generator: torch.Generator) -> None:
    """Schema, fake implementation and dispatch agree (``torch.library.opcheck``)."""
    moe = _layer(generator)
    x = torch.randn(3, 64, generator=generator)
    logits = torch.randn(3, 8, generator=generator)
    torch.library.opcheck(
        forward_op, (x, logits, None, None, moe.op_state(), moe.op_spec)
    )


def test_the_op_runs_the_tensors_it_is_given(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live layer holding the tensors runs them with its prepared form; tensors no
    live layer holds (its layer gone, or swapped in) get a layer built around them
    once, dropped with them."""
    builds: list[int] = []
    build = custom_op._build

    def counted(state: list[torch.Tensor | None], spec: str) -> Int4MoE:
        builds.append(1)
        return build(state, spec)

    monkeypatch.setattr(custom_op, "_build", counted)
    moe = _layer(generator)
    x = torch.randn(2, 64, generator=generator)
    expected = moe(x)
    state, spec, weights = moe.op_state(), moe.op_spec, moe.weights
    prepared = moe._prepared
    for _ in range(3):
        torch.testing.assert_close(
            forward_op(x, None, None, None, state, spec), expected
        )
    assert moe._prepared is prepared  # the layer's own cache, not a second prepare
    assert builds == []
    del moe
    gc.collect()
    for _ in range(3):  # the gate is wrapped anew inside: still built once
        torch.testing.assert_close(
            forward_op(x, None, None, None, state, spec), expected, **EXACT
        )
    assert builds == [1]
    other = _layer(generator)  # another layer's gate: its routing, these experts
    gate = STATE.index("gate_weight")
    mixed = [*state[:gate], other.gate_weight, *state[gate + 1 :]]
    routed = Int4MoE.from_quantized(weights, config=CFG, gate_weight=other.gate_weight)
    torch.testing.assert_close(
        forward_op(x, None, None, None, mixed, spec), routed(x), **EXACT
    )
    assert len(builds) == 2
    for _ in range(2):  # two states sharing w13_qdata, alternately: built once each
        forward_op(x, None, None, None, state, spec)
        forward_op(x, None, None, None, mixed, spec)
    assert len(builds) == 2
    del state, mixed, other
    gc.collect()
    assert custom_op._SHADOWS == {}  # dropped with the tensors they were built on


def test_a_spec_with_a_group_score_alone_still_runs(generator: torch.Generator) -> None:
    """Programs exported while MoEConfig took a group_score without groups (it did
    nothing; now refused) hold one in their spec: the op still builds and runs."""
    moe = _layer(generator)
    x = torch.randn(2, 64, generator=generator)
    expected, state, described = moe(x), moe.op_state(), json.loads(moe.op_spec)
    described["config"]["group_score"] = "max"
    del moe
    gc.collect()
    spec = json.dumps(described, sort_keys=True)
    out = forward_op(x, None, None, None, state, spec)
    torch.testing.assert_close(out, expected, **EXACT)


def test_a_shadow_sees_new_memory_and_yields_to_a_live_layer(
    generator: torch.Generator,
) -> None:
    """``t.data = ...`` on a tensor a shadow was built on builds it again; a live
    layer that takes the tensors over (``assign=True``) serves them from then on, so
    its ``invalidate_prepared`` reaches the compiled op."""
    moe = _layer(generator)
    x = torch.randn(2, 64, generator=generator)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    holder = _layer(generator)  # another layer's tensors, swapped for these
    holder.load_state_dict(state, assign=True)
    tensors, spec = holder.op_state(), holder.op_spec
    del holder
    gc.collect()
    expected = moe(x)
    torch.testing.assert_close(forward_op(x, None, None, None, tensors, spec), expected)
    w2_scale = tensors[STATE.index("w2_scale")]
    assert w2_scale is not None
    w2_scale.data = w2_scale * 2  # new memory, same tensor object
    with torch.no_grad():
        moe.get_buffer("w2_scale").mul_(2)
    moe.invalidate_prepared()
    doubled = moe(x)
    torch.testing.assert_close(forward_op(x, None, None, None, tensors, spec), doubled)
    taker = _layer(generator)
    given = {k: v for k, v in zip(STATE, tensors, strict=True) if v is not None}
    taker.load_state_dict(given, assign=True)
    assert taker.op_state()[0] is tensors[0]
    torch.testing.assert_close(
        forward_op(x, None, None, None, taker.op_state(), taker.op_spec), doubled
    )
    assert custom_op._SHADOWS == {}  # the live layer took over: the shadow is gone
    with torch.no_grad():
        taker.get_buffer("w2_scale").mul_(0.5)
    taker.invalidate_prepared()
    torch.testing.assert_close(
        forward_op(x, None, None, None, taker.op_state(), taker.op_spec), expected
    )


@pytest.mark.parametrize("name", ["w2_scale", "w13_qdata", "gate_weight"])
def test_a_shadow_sees_in_place_edits(name: str, generator: torch.Generator) -> None:
    """``copy_`` into a tensor a shadow was built on (``load_state_dict`` into an
    exported program's module does that) runs the new values: the weights through
    the layer's own prepared form, the router's, which the layer copies, by building
    the shadow again."""
    moe, other = _layer(generator), _layer(generator)
    x = torch.randn(2, 64, generator=generator)
    tensors = [None if t is None else t.clone() for t in moe.op_state()]
    spec = moe.op_spec
    torch.testing.assert_close(forward_op(x, None, None, None, tensors, spec), moe(x))
    target = tensors[STATE.index(name)]
    assert target is not None
    with torch.no_grad():
        target.copy_(other.get_parameter(name) if name == "gate_weight" else
                     other.get_buffer(name))  # fmt: skip
        moe_state = moe.state_dict()
        moe_state[name] = target.clone()
        moe.load_state_dict(moe_state)
    expected = moe(x)
    torch.testing.assert_close(
        forward_op(x, None, None, None, tensors, spec), expected, **EXACT
    )


def test_a_layer_whose_construction_failed_is_not_found_by_the_op(
    generator: torch.Generator,
) -> None:
    """The op scans the live layers; a half-built one (its constructor raised, the
    exception kept alive) must not be among them."""
    with pytest.raises(ConfigError) as failed:
        Int4MoE(CFG, num_local_experts=100)
    assert failed.value.__traceback__ is not None  # the half-built layer stays alive
    moe = _layer(generator)
    x = torch.randn(2, 64, generator=generator)
    tensors = [None if t is None else t.clone() for t in moe.op_state()]
    torch.testing.assert_close(
        forward_op(x, None, None, None, tensors, moe.op_spec), moe(x), **EXACT
    )


def test_functional_call_under_compile_runs_the_weights_passed(
    generator: torch.Generator,
) -> None:
    """``torch.func.functional_call`` swaps the module's tensors: the compiled op
    runs the swapped ones, as eager does."""
    mine, theirs = _layer(generator), _layer(generator)
    x = torch.randn(3, 64, generator=generator)

    def call(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.func.functional_call(mine, state, (x,))
        return out

    with torch.no_grad():
        torch._dynamo.reset()
        got = torch.compile(call, backend="aot_eager", fullgraph=True)(
            theirs.state_dict(), x
        )
        torch.testing.assert_close(got, theirs(x), **EXACT)
        assert not torch.allclose(got, mine(x))


def test_an_in_graph_edit_of_a_buffer_runs_before_the_op(
    generator: torch.Generator,
) -> None:
    """The op reads the buffers it is given, so a compiler orders writes to them
    before it (it used to move the write-back after the op)."""
    moe = _layer(generator)
    x = torch.randn(3, 64, generator=generator)

    def edit_then_run(x: torch.Tensor) -> torch.Tensor:
        moe.get_buffer("w2_scale").mul_(2.0)
        out: torch.Tensor = moe(x)
        return out

    with torch.no_grad():
        before = moe(x)
        torch._dynamo.reset()
        got = torch.compile(edit_then_run, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got, 2 * before, rtol=1e-5, atol=1e-6)


def test_identical_layers_share_one_graph(generator: torch.Generator) -> None:
    """Regional compilation (each block compiled alone): equal specs, no guard on
    which layer, so twelve layers compile once, even with ``fullgraph=True``."""
    blocks = [nn.Sequential(nn.Linear(64, 64), _layer(generator)) for _ in range(12)]
    frames: list[int] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        del inputs
        frames.append(1)
        return gm.forward

    x = torch.randn(3, 64, generator=generator)
    with torch.no_grad():
        torch._dynamo.reset()
        y, expected = x, x
        for block in blocks:
            y = torch.compile(block, backend=backend, fullgraph=True)(y)
            expected = block(expected)
    torch.testing.assert_close(y, expected, **EXACT)
    assert len(frames) == 1


def test_an_exported_program_keeps_its_weights(
    generator: torch.Generator, tmp_path: Path
) -> None:
    """``torch.export`` lifts the state into the program; loaded while its layer is
    gone and another one exists, it still runs its own weights."""
    model = nn.Sequential(nn.Linear(64, 64), _layer(generator))
    x = torch.randn(3, 64, generator=generator)
    with torch.no_grad():
        expected = model(x)
        torch.export.save(torch.export.export(model, (x,)), tmp_path / "m.pt2")
    del model
    gc.collect()
    other = _layer(generator)
    with torch.no_grad():
        other(x)
        got = torch.export.load(tmp_path / "m.pt2").module()(x)
    torch.testing.assert_close(got, expected, **EXACT)


_LOAD_ELSEWHERE = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
if sys.argv[3] == "import":
    import modules  # registers int4_moe::forward, which the program calls
x, expected = torch.load(sys.argv[2] + "/io.pt")
with torch.no_grad():
    got = torch.export.load(sys.argv[2] + "/m.pt2").module()(x)
torch.testing.assert_close(got, expected, rtol=0, atol=0)
print("same")
"""


@pytest.mark.parametrize("first", ["import", "no-import"])
def test_an_exported_program_loads_in_another_process(
    generator: torch.Generator, tmp_path: Path, first: str
) -> None:
    """As the README says: a fresh process that has run ``import modules`` loads and
    runs the program bit for bit; one that has not is refused, naming the op."""
    model = nn.Sequential(nn.Linear(64, 64), _layer(generator))
    x = torch.randn(3, 64, generator=generator)
    with torch.no_grad():
        torch.save((x, model(x)), tmp_path / "io.pt")
        torch.export.save(torch.export.export(model, (x,)), tmp_path / "m.pt2")
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_ELSEWHERE, root, str(tmp_path), first],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if first == "import":
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "same"
    else:
        assert done.returncode != 0
        assert "resolve torch.ops.int4_moe.forward" in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("no_grad", [True, False], ids=["no_grad", "grad_mode"])
def test_the_bare_layer_with_its_own_router_exports(
    generator: torch.Generator, no_grad: bool
) -> None:
    """The layer as the root module, with its gate and absent optional buffers (zero
    points, biases, correction bias, expert map): torch's non-strict export indexes
    buffers by position, ``None`` ones counted; they are kept after the tensors."""
    layer = _layer(generator)
    x = torch.randn(3, 64, generator=generator)
    absent = [name for name, t in layer._buffers.items() if t is None]
    assert absent  # the case: absent buffers beside a parameter
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        program = torch.export.export(layer, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), layer(x), **EXACT)


# Inductor's own imports use torch.jit.script_method, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_inductor_runs_the_op(generator: torch.Generator) -> None:
    """Inductor (the default backend) lowers the op to a call of its eager body: the
    layer alone compiles to no generated kernel, equal to eager over shapes."""
    moe = _layer(generator)
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(moe, fullgraph=True)
        for tokens in (4, 4, 7, 0):
            x = torch.randn(tokens, 64, generator=generator)
            torch.testing.assert_close(compiled(x), moe(x), **EXACT)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_inductor_takes_a_strided_input(generator: torch.Generator) -> None:
    """A transposed (seq-first) input: the op's output is contiguous, and so is its
    fake, which inductor checks the real output's strides against."""
    moe = _layer(generator)

    def model(h_SBD: torch.Tensor) -> torch.Tensor:
        return moe(h_SBD.transpose(0, 1)) + 1

    x = torch.randn(5, 2, 64, generator=generator)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(compiled, model(x), **EXACT)
        fake = torch.library.opcheck(
            forward_op,
            (x.transpose(0, 1), None, None, None, moe.op_state(), moe.op_spec),
        )
    assert all(result == "SUCCESS" for result in fake.values())
    assert moe(x.transpose(0, 1)).is_contiguous()


# As in test_training_keeps_a_graph_break_and_the_backward.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_a_trainable_router_keeps_the_graph_break(generator: torch.Generator) -> None:
    """The module's own ``gate_weight`` trained, the input frozen: compiled, the gate
    gets the gradient it gets in eager (the op has no backward: a graph break)."""
    moe = _layer(generator)
    gate = moe.gate_weight
    assert gate is not None
    gate.requires_grad_()
    x = torch.randn(4, 64, generator=generator)
    (expected,) = torch.autograd.grad(moe(x).sum(), gate)
    torch._dynamo.reset()
    compiled = torch.compile(moe, backend="aot_eager")(x)
    (got,) = torch.autograd.grad(compiled.sum(), gate)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_a_layer_pickled_before_the_op_took_a_spec_still_compiles(
    generator: torch.Generator,
) -> None:
    moe = _layer(generator)
    state = moe.__getstate__()
    del state["op_spec"], state["_checked_map"]  # as pickled by an earlier version
    old = Int4MoE.__new__(Int4MoE)
    old.__setstate__(state)
    x = torch.randn(3, 64, generator=generator)
    with torch.no_grad():
        torch._dynamo.reset()
        got = torch.compile(old, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(got, moe(x), **EXACT)


def test_among_layers_sharing_tensors_the_spec_picks_the_layer(
    generator: torch.Generator,
) -> None:
    """Two layers on the very same int4 tensors, one renormalizing: each call runs
    the layer its spec describes, whichever was found last."""
    shared = _layer(generator)
    norm = Int4MoE.from_quantized(shared.weights, config=CFG, backend="reference")
    plain = Int4MoE.from_quantized(
        shared.weights, config=attrs.evolve(CFG, renormalize=False),
        backend="reference",
    )  # fmt: skip
    assert norm.w13_qdata is plain.w13_qdata
    x = torch.randn(4, CFG.hidden_size, generator=generator)
    logits = torch.randn(4, CFG.num_experts, generator=generator)
    assert not torch.allclose(norm(x, logits), plain(x, logits))
    for layer in (norm, plain, norm, plain):
        torch.testing.assert_close(
            forward_op(x, logits, None, None, layer.op_state(), layer.op_spec),
            layer(x, logits),
            **EXACT,
        )


def test_no_grad_keeps_the_op_for_an_input_that_requires_grad(
    generator: torch.Generator,
) -> None:
    """Under ``torch.no_grad()`` nothing is recorded, so an input that requires a
    gradient still goes through the op: the graph has no break (``fullgraph``)."""
    layer = _layer(generator)
    x = torch.randn(3, CFG.hidden_size, generator=generator, requires_grad=True)
    with torch.no_grad():
        targets = _graph_targets(layer, x)
        expected = layer(x)
    assert sum("int4_moe.forward" in t for t in targets) == 1
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, expected, **EXACT)
    assert not got.requires_grad
