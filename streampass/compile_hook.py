"""The hook on inductor's ``compile_fx``: which compiles get StreamPass, and what of a graph's
streams enters torch's cache keys.

``torch.compile`` compiles lazily, and more than once: the forward at the first call, the
backward at the first ``.backward()``, and the forward again whenever a guard fails (a new batch
size, ``model.eval()``, an input that stops requiring grad). A training loop makes most of these
compiles after its ``enabled()`` block has ended, and a stream-annotated graph compiled without
StreamPass runs its kernels on their streams with none of the forward's syncs (on CUDA), or
crashes in torch's own AOT pass (on CPU). So, while the hook is installed:

* a compile that starts inside a :func:`scope` (an ``enabled()`` block) gets the scope's passes
  as ``config_patches``, which torch re-applies to the backward it compiles later;
* a frame (a code object: a function, a module's ``forward``, a graph-break continuation) that
  was compiled inside a scope keeps that scope for every later compile, after the block too,
  until ``torch._dynamo.reset()``; a frame first compiled after the block gets nothing;
* every other compile gets the process-wide scope (:func:`everywhere`: ``enable()``), if one is
  set, even one whose ``torch.compile(options=...)`` replaces the post-grad passes, and its frame
  keeps that scope as a frame compiled in a block does (after ``disable()`` too);
* every graph compiled with a StreamPass (a scope's, ``enable()``'s or ``torch.compile(options=...)``'s)
  carries :func:`stream_key` as a module attribute. torch's AOT-autograd and FX-graph cache keys
  pickle a graph's code and attributes but not ``node.meta``, where stream annotations live: without
  it two programs that differ only in where their streams are share a cache entry, and the second
  silently gets the first's streams.

The hook knows nothing of StreamPass itself: :func:`install` takes the test for "this post-grad
config holds a StreamPass", a scope the function that adds its StreamPass to a config.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from streampass.analysis.bodies import INLINED_KEY, inlined
from streampass.aot_guard import cpu_safe_aot
from streampass.donated_buffers import keep_shared_saved_tensors
from streampass.transform.dynamo_indices import forward_offset

#: the inductor config entry StreamPass goes in
KEY = "post_grad_custom_post_pass"
#: the module attribute :func:`stream_key` is kept in, which both of torch's cache keys pickle
KEY_ATTRIBUTE = "_streampass_streams"

_scopes: list[Callable[[Any], Any]] = []  # the open scopes, innermost last
_everywhere: Callable[[Any], Any] | None = None  # the process-wide scope (enable()), under them all
#: code object -> (its scope, dynamo's state dict for the code when the scope was recorded)
_frames: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_holds_pass: Callable[[Any], bool] = lambda config_value: False  # set by install()
_state = threading.local()  # .active: inside a hooked compile (compile_fx calls itself); .captured


def stream_key(gm: torch.fx.GraphModule, offset: int = 0) -> tuple:
    """The streams of ``gm`` as torch's cache keys must see them: every ``custom.stream``
    annotation, by node, in graph order, nested graphs included, and the index offset the pass
    will read dynamo's indices with (:mod:`streampass.transform.dynamo_indices`).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         a = x.sin()
    ...     return a + x.cos()
    >>> stream_key(make_fx(f)(torch.ones(2)))
    (0, ('', 'sin', '1'))
    """
    return (offset,) + tuple(
        (name, node.name, repr(node.meta["custom"]["stream"]))
        for name, module in gm.named_modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if isinstance(node.meta.get("custom"), dict) and "stream" in node.meta["custom"]
    )


def _stamp(gm: Any, offset: int) -> None:
    if isinstance(gm, torch.fx.GraphModule):
        setattr(gm, KEY_ATTRIBUTE, stream_key(gm, offset))


@contextlib.contextmanager
def scope(add: Callable[[Any], Any]) -> Iterator[None]:
    """Compiles that start in the block, and later compiles of the frames they compiled, get
    ``add(post-grad config)`` as their post-grad passes. Needs :func:`install`."""
    _scopes.append(add)
    try:
        yield
    finally:
        _scopes.remove(add)


def everywhere(add: Callable[[Any], Any] | None) -> None:
    """Make ``add`` the process-wide scope: every compile that no :func:`scope` answers for
    (neither open now nor remembered for the frame) gets ``add(post-grad config)``, whatever
    its own config says. ``None`` removes it. Needs :func:`install`."""
    global _everywhere
    _everywhere = add


def install(holds_pass: Callable[[Any], bool]) -> None:
    """Hook ``torch._inductor.compile_fx.compile_fx`` (once; later calls do nothing).
    ``holds_pass(config value)``: whether a post-grad config already holds a StreamPass.

    ``torch.compile``'s inductor backend looks ``compile_fx`` up on its module at each compile, so
    the module attribute is the one place every compile passes. A compile with no StreamPass and
    no scope goes through untouched.
    """
    from torch._inductor import compile_fx as module
    from torch._inductor import config

    global _holds_pass
    if getattr(module.compile_fx, "_streampass_hook", False):
        return
    _holds_pass = holds_pass
    original = module.compile_fx
    signature = inspect.signature(original)

    @functools.wraps(original)
    def compile_fx(*args, **kwargs):
        if getattr(_state, "active", False):  # compile_fx calls itself once it has patched
            return original(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        patches = dict(call.arguments["config_patches"] or {})
        add = _scope_of_this_compile()
        if add is not None:
            patches[KEY] = add(patches.get(KEY, getattr(config, KEY)))
        elif not _holds_pass(patches.get(KEY, getattr(config, KEY))):
            return original(*args, **kwargs)
        _warn_if_in_eager_block()
        _state.captured = _in_precompile()
        try:
            offset = forward_offset()
            _stamp(call.arguments["model_"], offset)
            call.arguments["inner_compile"] = _stamping(call.arguments["inner_compile"], offset)
            call.arguments["config_patches"] = patches or None
            _state.active = True
            with cpu_safe_aot():  # a recompile after the block still needs the CPU guard
                return original(*call.args, **call.kwargs)
        finally:
            _state.active = _state.captured = False

    compile_fx._streampass_hook = True
    module.compile_fx = compile_fx


def _warn_if_in_eager_block() -> None:
    """An eager ``with sp.stream(k):`` around the call being compiled leaves its annotation in
    ``fx.traceback``, which dynamo copies onto every node of this graph without a guard: the
    call that compiles first decides, for every later call in the block or out of it."""
    from torch.fx import traceback as fx_traceback

    from streampass.errors import StreamPassWarning

    k = (fx_traceback.current_meta.get("custom") or {}).get("stream")
    if k is not None:
        warnings.warn(
            StreamPassWarning(
                f"torch.compile compiles a function called inside an eager `with sp.stream({k})` block: "
                "dynamo puts the whole graph on that stream without guarding on it, so later calls, in "
                "the block or out of it, reuse what this one compiled; put the block inside the function"
            ),
            stacklevel=2,
        )


def _stamping(inner_compile: Callable, offset: int) -> Callable:
    """``inner_compile`` (what compiles each of AOT's graphs, the lazy backward included) that
    first gives the graph its :func:`stream_key`, marks the subgraphs inductor will inline into
    a kernel (:func:`streampass.analysis.bodies.inlined`: the post-grad passes get them on their
    own, before the graph, and StreamPass must leave them alone), and keeps a forward's saved
    tensors that share storage out of the backward's donated buffers
    (:mod:`streampass.donated_buffers`)."""

    @functools.wraps(inner_compile)
    def compile_with_key(gm, *args, **kwargs):
        _stamp(gm, offset)
        if isinstance(gm, torch.fx.GraphModule):
            for module, op in inlined(gm):
                module.meta[INLINED_KEY] = op
            if not kwargs.get("is_backward", False):
                keep_shared_saved_tensors(gm)
        with _in_process():
            return inner_compile(gm, *args, **kwargs)

    return compile_with_key


def _in_precompile() -> bool:
    """Whether dynamo's precompile (``torch.compile(f).aot_compile(...)``) is compiling on this
    thread: it calls the backend right after capturing the frame, outside dynamo's tracer, so
    the object table still holds that frame's objects."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "aot_compile_fullgraph" and frame.f_globals.get("__name__") == "torch._dynamo.aot_compile":
            return True
        frame = frame.f_back
    return False


# torch's out-of-process switch is a module global: threads compiling with StreamPass at once
# share one override, put back by the last one out
_in_process_lock = threading.Lock()
_in_process_saved: dict[str, Any] = {}  # torch's values of the globals while overridden
_in_process_users = 0


@contextlib.contextmanager
def _in_process() -> Iterator[None]:
    """Compile in this process, whatever ``TORCHINDUCTOR_FX_COMPILE_MODE`` says. Its out-of-process
    modes (``subprocess``, with ``async+``/``progressive+``) send the worker inductor's config
    without any post-grad custom pass (torch's ``config._save_config_ignore``): the graph would
    compile without StreamPass, with no syncs on a GPU (on CPU the code fails: ``stream1`` is not
    defined)."""
    global _in_process_users
    from torch._inductor import compile_fx as module

    subprocess = getattr(getattr(module, "FxCompileMode", None), "SUBPROCESS", None)
    with _in_process_lock:
        # another thread's override holds: this compile must keep it until it is done too
        overriding = _in_process_users > 0 or (subprocess is not None and module.fx_compile_mode == subprocess)
        if overriding:
            if not _in_process_users:
                names = ("fx_compile_mode", "fx_compile_async", "fx_compile_progressive")
                _in_process_saved.update({name: getattr(module, name) for name in names if hasattr(module, name)})
                module.fx_compile_mode = module.FxCompileMode.NORMAL
                module.fx_compile_async = module.fx_compile_progressive = False
            _in_process_users += 1
    if not overriding:
        yield
        return
    from streampass.errors import StreamPassWarning

    warnings.warn(
        StreamPassWarning(
            "TORCHINDUCTOR_FX_COMPILE_MODE compiles out of process, where inductor drops post-grad custom "
            "passes: graphs compiled with StreamPass are compiled in this process instead"
        ),
        stacklevel=1,  # this line: the default filter then says it once per process
    )
    try:
        yield
    finally:
        with _in_process_lock:
            _in_process_users -= 1
            if not _in_process_users:
                for name, value in _in_process_saved.items():
                    setattr(module, name, value)
                _in_process_saved.clear()


def _scope_of_this_compile() -> Callable[[Any], Any] | None:
    code, state = _frame()
    if _scopes:
        if code is not None:
            _frames[code] = (_scopes[-1], state)
        return _scopes[-1]
    add, seen_state = _frames.get(code, (None, None)) if code is not None else (None, None)
    # torch._dynamo.reset() forgets every compiled frame (as a new process would), and dynamo
    # then keeps a new state dict for the code: a compile after it is a first compile again.
    if add is not None and seen_state is state:
        return add
    if add is not None:
        del _frames[code]  # reset since: its continuations are first compiles too
    elif code is not None:
        add = _scope_continued(code)
        if add is not None:
            _frames[code] = (add, state)
            return add
    if _everywhere is not None and code is not None:
        _frames[code] = (_everywhere, state)  # its recompiles after disable() keep the pass
    return _everywhere


def _scope_continued(code) -> Callable[[Any], Any] | None:
    """The scope of the function ``code`` continues, if ``code`` is a graph-break continuation
    dynamo made of a function compiled in a scope (``torch_dynamo_resume_in_f_at_N``): dynamo
    makes one the first time a call takes that path, which may be after the block."""
    from torch._dynamo.resume_execution import ContinueExecutionCache

    made_from = getattr(ContinueExecutionCache, "generated_code_metadata", {})
    seen = set()
    while code not in seen:
        seen.add(code)
        meta = made_from.get(code)
        code = getattr(meta, "code", None)
        if code is None:
            return None
        if code in _frames:
            return _frames[code][0]
    return None


def compiling_frame() -> bool:
    """Whether dynamo is compiling a frame now (its object table holds that frame's objects):
    tracing it, or compiling what its precompile (``aot_compile``) just captured."""
    return _frame()[0] is not None or getattr(_state, "captured", False)


def _frame() -> tuple[Any, Any]:
    """The code object dynamo is compiling now and the state dict dynamo keeps for that code
    until ``torch._dynamo.reset()`` (its instruction translator is live while the backend runs);
    Nones outside dynamo."""
    from torch._dynamo import symbolic_convert

    tx = getattr(symbolic_convert.tls, "current_tx", None)
    return getattr(tx, "f_code", None), getattr(getattr(tx, "output", None), "frame_state", None)
