"""DeepEP's Buffer API over epcomm's engines.

CPU tensors go to the host engine over shared memory (every rank of the group
on one host). Normal mode's bf16 and fp8 calls share one engine, fp32 calls
have their own, and each low-latency shape gets its own; an engine is built
on first use by a call every rank makes with the same type and sizes (DeepEP
requires the same of its callers), so one Buffer serves bf16, fp8 and fp32
calls. Calls on CPU tensors complete before they return, and the
EventOverlap they give back has nothing left to wait for, except a combine
with async_finish=True: it runs on the engine's communication thread while
the caller goes on, and its EventOverlap waits for it. A previous_event is
waited for before a call starts.
"""

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import _epcomm
from ._group import bootstrap_of
from .errors import error, unsupported

# Normal mode's token bound when num_nvl_bytes is a byte budget: the budget
# bounds the buffer, this only the host memory of one call's results.
_TOKENS_UNDER_A_BUDGET = 1 << 16


def _dl(t):
    return None if t is None else to_dlpack(t.contiguous())


class EventOverlap:
    """DeepEP's EventOverlap. A call made without async_finish has completed
    when it returns: `event` is None and waiting is immediate. A combine made
    with async_finish=True runs on the buffer's communication thread: `event`
    is that pending call, and its outputs may be read only after
    current_stream_wait(), which raises the call's epcomm.Error if it failed.
    The context-manager form works as in DeepEP."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self):
        if self.event is not None:
            self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()


class _PendingEvent:
    """EventOverlap.event of a call on the communication thread."""

    def __init__(self, pending):
        self.pending = pending

    def query(self):
        return self.pending.ready()

    def current_stream_wait(self):
        self.pending.wait()


@dataclass(eq=False)
class Config:
    """DeepEP's Config: SMs and chunk sizes of the GPU kernels, in DeepEP's
    argument order. The host engine uses no SMs and moves whole calls, so it
    records them only."""

    num_sms: int = 20
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """num_nvl_bytes for a Buffer whose normal mode then holds, per rank,
        the tokens DeepEP keeps in flight: a receive chunk per channel (two
        SMs each). epcomm takes it as its byte budget: a dispatch larger
        than the windows it leaves moves through them in rounds."""
        return self.num_sms // 2 * self.num_max_nvl_chunked_recv_tokens * num_ranks * hidden_bytes

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: the host engine keeps every rank on one node, with no RDMA buffer."""
        return 0


@dataclass(eq=False)
class _NormalHandle:
    """What combine and a cached dispatch need of one dispatch."""

    engine: object
    num_experts: int
    cpp: object
    topk_idx: object
    topk_weights: object
    recv_src_idx: object

    @property
    def num_recv_tokens(self):
        return self.cpp.num_recv_tokens


@dataclass(eq=False)
class _LowLatencyHandle:
    """One low-latency dispatch, with DeepEP's handle fields (src_info,
    layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts);
    src_info, layout_range and `cpp` are set once the dispatch has been
    received."""

    engine: object
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int
    src_info: object = None
    layout_range: object = None
    cpp: object = None


def _add_wait_ns(stats, after, before):
    """Adds to DeepEP's int64 [R] wait-cost tensor the nanoseconds waited per
    rank between two readings of the engine's cumulative wait times."""
    waited = [int((a - b).total_seconds() * 1e9) for a, b in zip(after, before)]
    stats.add_(torch.tensor(waited, dtype=torch.int64))


def _aligned(counts, alignment):
    return [(c + alignment - 1) // alignment * alignment for c in counts]


class Buffer:
    """DeepEP's Buffer, built collectively from a torch.distributed group.

    Sizes: normal mode serves bf16 and fp8 from one engine, its receive
    region sized for bf16 rows, and fp32 (an epcomm extension, twice the
    bytes per row) from a second one built when first used. Each is sized by
    `num_experts`, `hidden`, `max_topk` and `num_max_tokens_per_rank` when
    given as keyword arguments; a size not given is taken from the engine's
    first call (experts from `num_tokens_per_expert`, hidden from x, top-k
    from topk_idx). `num_nvl_bytes` is each engine's byte budget, as
    DeepEP's: the buffer never takes more, and a dispatch larger than it
    moves through it in rounds (epcomm's max_buffer_bytes), so tokens are
    bounded only by num_max_tokens_per_rank (default 65536). Low-latency
    mode sizes its engines by the arguments of
    `low_latency_dispatch` itself. `timeout_ms` bounds every call (default:
    EPCOMM_TIMEOUT_MS or the library's); `enable_shrink` keeps going without
    a rank whose process exited (epcomm's mask_lost_ranks).
    """

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True,
                 allow_mnnvl=False, use_fabric=False, explicitly_destroy=False,
                 enable_shrink=False, comm=None, *, num_experts=None, hidden=None,
                 max_topk=None, num_max_tokens_per_rank=None, timeout_ms=None):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.group_size = dist.get_world_size(self.group)
        if comm is not None:
            raise unsupported(self.rank, "Buffer", "comm",
                              "epcomm bootstraps through the torch.distributed group")
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self._sizes = dict(num_experts=num_experts, hidden=hidden, max_topk=max_topk,
                           max_tokens_per_rank=num_max_tokens_per_rank)
        self._timeout = datetime.timedelta(
            milliseconds=timeout_ms if timeout_ms is not None
            else int(os.environ.get("EPCOMM_TIMEOUT_MS", "0")) or 100_000)
        self._mask_lost_ranks = enable_shrink
        self._normal = {}
        self._low_latency = {}
        self._bootstrap = bootstrap_of(self.group, _epcomm)

    # -- configuration ---------------------------------------------------------------------

    @staticmethod
    def set_num_sms(new_num_sms):
        if new_num_sms < 1 or new_num_sms % 2:
            raise ValueError(f"num_sms must be a positive even number, got {new_num_sms}")
        Buffer.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def capture():
        """An EventOverlap at this point of the calling thread: on CPU every
        earlier call has completed, so there is nothing to record."""
        return EventOverlap()

    @staticmethod
    def is_sm90_compiled():
        return False

    def destroy(self):
        """Releases every engine (collective when explicitly_destroy is set,
        as in DeepEP); the Buffer refuses calls afterwards."""
        self._normal.clear()
        self._low_latency.clear()
        self._bootstrap = None

    def lost_ranks(self):
        """Ranks masked so far (enable_shrink), over every engine, ascending."""
        lost = set()
        for engine in [e for e, _ in self._normal.values()] + list(self._low_latency.values()):
            lost.update(engine.lost_ranks())
        return sorted(lost)

    # -- normal mode -----------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """(num_tokens_per_rank [R] int32, None, num_tokens_per_expert [E] int32,
        is_token_in_rank [T][R] bool, EventOverlap). The second is DeepEP's
        per-node count, None within one node."""
        self._host_only("get_dispatch_layout", topk_idx)
        if num_experts % self.group_size:
            raise error(self.rank, "get_dispatch_layout",
                        f"invalid input: {num_experts} experts do not divide over "
                        f"{self.group_size} ranks")
        valid = topk_idx >= 0
        if bool((topk_idx >= num_experts).any()):
            raise error(self.rank, "get_dispatch_layout",
                        f"invalid input: an expert id in topk_idx is >= num_experts "
                        f"({num_experts})")
        per_expert = torch.bincount(topk_idx[valid], minlength=num_experts).to(torch.int32)
        dest = torch.where(valid, topk_idx // (num_experts // self.group_size),
                           torch.full_like(topk_idx, -1))
        ranks = torch.arange(self.group_size, dtype=topk_idx.dtype)
        in_rank = (dest.unsqueeze(2) == ranks.view(1, 1, -1)).any(dim=1)
        per_rank = in_rank.sum(dim=0).to(torch.int32)
        return per_rank, None, per_expert, in_rank, EventOverlap()

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        """(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, EventOverlap); recv_x is (tensor, scales) for fp8 input. With
        `handle` (a cached dispatch) the rows go along that dispatch's routing,
        with no layout or count exchange, and only recv_x is returned, the rest
        None. Without topk_idx tokens go where is_token_in_rank says, and the
        top-k results are None."""
        x, x_scales = x if isinstance(x, tuple) else (x, None)
        self._host_only("dispatch", x)
        if previous_event is not None:
            previous_event.current_stream_wait()
        if handle is not None:
            if not isinstance(handle, _NormalHandle):
                raise error(self.rank, "dispatch", "invalid input: handle is not a dispatch handle "
                            "of an epcomm Buffer")
            engine, _, kind = self._normal_engine(x, x_scales, handle.topk_idx,
                                                  handle.num_experts)
            _, rx, rs = engine.dispatch_cached(kind, _dl(x), _dl(x_scales), handle.cpp)
            recv_x = from_dlpack(rx).clone()
            if rs is not None:
                recv_x = (recv_x, from_dlpack(rs).clone())
            return recv_x, None, None, None, None, EventOverlap()
        engine, num_experts, kind = self._normal_engine(
            x, x_scales, topk_idx,
            None if num_tokens_per_expert is None else num_tokens_per_expert.numel())
        with_topk = topk_idx is not None
        if not with_topk:
            if is_token_in_rank is None:
                raise error(self.rank, "dispatch", "invalid input: neither topk_idx nor "
                            "is_token_in_rank says where the tokens go")
            topk_idx = self._rank_routing(is_token_in_rank, num_experts)
            topk_weights = torch.ones(topk_idx.shape, dtype=torch.float32)
        n, rx, rs, ridx, rw, rsrc, per_expert, cpp = engine.dispatch(
            kind, _dl(x), _dl(x_scales), _dl(topk_idx), _dl(topk_weights), num_worst_tokens,
            expert_alignment)
        recv_x = from_dlpack(rx).clone()
        if rs is not None:
            recv_x = (recv_x, from_dlpack(rs).clone())
        recv_src_idx = from_dlpack(rsrc).clone()
        new_handle = _NormalHandle(engine, num_experts, cpp, topk_idx, topk_weights, recv_src_idx)
        if not with_topk:
            return recv_x, None, None, self._expert_counts(num_tokens_per_expert, num_experts,
                                                           expert_alignment, num_worst_tokens), \
                new_handle, EventOverlap()
        recv_topk_weights = from_dlpack(rw).clone() if topk_weights is not None else None
        # With num_worst_tokens DeepEP leaves the list empty (no host sync).
        counts = [] if num_worst_tokens else per_expert
        return (recv_x, from_dlpack(ridx).clone(), recv_topk_weights, counts, new_handle,
                EventOverlap())

    def _expert_counts(self, num_tokens_per_expert, num_experts, alignment, num_worst_tokens):
        """Without topk_idx, what DeepEP returns as the per-expert list: every
        rank's num_tokens_per_expert for this rank's experts, summed (a group
        all_reduce: the engine counted only the ranks it routed to)."""
        if num_worst_tokens or num_tokens_per_expert is None:
            return []
        total = num_tokens_per_expert.to(torch.int64).clone()
        dist.all_reduce(total, group=self.group)
        per_rank = num_experts // self.group_size
        return _aligned(total[self.rank * per_rank:(self.rank + 1) * per_rank].tolist(), alignment)

    def _rank_routing(self, is_token_in_rank, num_experts):
        """A topk_idx that sends each token to the ranks is_token_in_rank names:
        the first expert of each, one slot per rank."""
        first_expert = torch.arange(self.group_size, dtype=torch.int64) * (
            num_experts // self.group_size)
        return torch.where(is_token_in_rank, first_expert.view(1, -1),
                           torch.full((1, self.group_size), -1, dtype=torch.int64))

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        """(combined_x [T][H], combined_topk_weights [T][K] or None, EventOverlap):
        each token's rows summed over the ranks it was sent to, in fp32."""
        self._host_only("combine", x)
        if not isinstance(handle, _NormalHandle):
            raise error(self.rank, "combine", "invalid input: handle is not a dispatch handle of "
                        "an epcomm Buffer")
        bias_0, bias_1 = (bias if isinstance(bias, tuple) else (bias, None)) \
            if bias is not None else (None, None)
        cpp = handle.cpp
        out = torch.empty(cpp.num_tokens, cpp.hidden, dtype=x.dtype)
        out_weights = torch.empty(cpp.num_tokens, cpp.topk, dtype=torch.float32) \
            if topk_weights is not None else None
        kind = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(x.dtype, str(x.dtype))
        args = (kind, _dl(x), cpp, _dl(topk_weights), _dl(bias_0), _dl(bias_1), to_dlpack(out),
                _dl(out_weights))
        if previous_event is not None:
            previous_event.current_stream_wait()
        if async_finish:
            pending = _PendingEvent(handle.engine.combine_async(*args))
            return out, out_weights, EventOverlap(pending, (x, topk_weights, bias, out, out_weights))
        handle.engine.combine(*args)
        return out, out_weights, EventOverlap()

    def get_combine_buffer(self, handle):
        """Where combine's x can be written so that combine copies none of it
        ([num_recv_tokens][H], the combine type): epcomm's combine_send_buffer."""
        return from_dlpack(handle.engine.combine_send_buffer(handle.cpp))

    # -- low-latency mode ------------------------------------------------------------------

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts):
        """Bytes of one fp8/bf16 low-latency region pair, DeepEP's formula's
        order of magnitude: epcomm allocates its own and ignores the budget."""
        per_row = hidden * 2 + hidden // 128 * 4 + 16
        return 2 * 2 * num_max_dispatch_tokens_per_rank * num_experts * per_row

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False):
        """(recv_x or (recv_x, recv_x_scales), recv_count, handle, EventOverlap, hook)."""
        op = "low-latency dispatch"
        self._host_only(op, x)
        if use_ue8m0 and not (use_fp8 and round_scale):
            raise error(self.rank, op, "invalid input: use_ue8m0 needs use_fp8 and round_scale")
        if x.dtype != torch.bfloat16:
            raise error(self.rank, op, f"invalid input: x must be bfloat16, got {x.dtype}")
        engine = self._low_latency_engine(use_fp8, round_scale, use_ue8m0, num_experts, x.size(1),
                                          topk_idx.size(1), num_max_dispatch_tokens_per_rank)
        receive = engine.dispatch_send(_dl(x), _dl(topk_idx), use_fp8)
        handle = _LowLatencyHandle(engine, num_max_dispatch_tokens_per_rank, x.size(1),
                                   num_experts)
        local_experts = num_experts // self.group_size
        rows = self.group_size * num_max_dispatch_tokens_per_rank
        wait_before = engine.dispatch_wait() if dispatch_wait_recv_cost_stats is not None else None

        def finish():
            rx, rs, count, src, ranges, cpp = receive()
            handle.cpp = cpp
            handle.src_info = from_dlpack(src)
            handle.layout_range = from_dlpack(ranges)
            count = from_dlpack(count)
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(count)
            if wait_before is not None:
                _add_wait_ns(dispatch_wait_recv_cost_stats, engine.dispatch_wait(), wait_before)
            # The buffer's token-major scales, viewed [E_local][rows][groups].
            scales = None if rs is None else from_dlpack(rs).transpose(1, 2)[:, :rows]
            return from_dlpack(rx), scales, count

        # Fresh tensors, as DeepEP's (a later call on this parity reuses the
        # region), with its strides: scales token-contiguous, [E_local][rows][G]
        # fp32 or, with use_ue8m0, [E_local][rows][ceil(G / 4)] int32.
        rx = torch.empty(local_experts, rows, x.size(1),
                         dtype=torch.uint8 if use_fp8 else torch.bfloat16)
        rs = None
        if use_fp8:
            groups = x.size(1) // 128
            rs = (torch.empty(local_experts, (groups + 3) // 4, rows, dtype=torch.int32)
                  if use_ue8m0 else torch.empty(local_experts, groups, rows)).transpose(1, 2)
        count = torch.empty(local_experts, dtype=torch.int32)

        def hook():
            got_x, got_s, got_count = finish()
            rx.copy_(got_x)
            count.copy_(got_count)
            if rs is not None:
                rs.copy_(got_s)

        if not return_recv_hook:
            hook()
            return (rx if rs is None else (rx, rs)), count, handle, EventOverlap(), None
        # DeepEP hands out the tensors now and fills them in the hook.
        return (rx if rs is None else (rx, rs)), count, handle, EventOverlap(), hook

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False, out=None,
                            combine_wait_recv_cost_stats=None):
        """(combined_x [T][H] bf16, EventOverlap, hook): each token's expert
        outputs weighted by topk_weights and summed."""
        op = "low-latency combine"
        self._host_only(op, x)
        if use_logfmt:
            raise unsupported(self.rank, op, "use_logfmt", "combine sends bf16 rows")
        if not isinstance(handle, _LowLatencyHandle):
            raise error(self.rank, op, "invalid input: handle is not a low-latency dispatch "
                        "handle of an epcomm Buffer")
        if handle.cpp is None:
            raise error(self.rank, op, "invalid input: the dispatch's receive hook has not run")
        engine = handle.engine
        if zero_copy:
            # As in DeepEP, the rows are where get_next_low_latency_combine_buffer
            # put them, whatever x is.
            x = self.get_next_low_latency_combine_buffer(handle)
        wait_before = engine.combine_wait() if combine_wait_recv_cost_stats is not None else None
        receive = engine.combine_send(_dl(x), _dl(topk_idx), _dl(topk_weights), handle.cpp)
        combined = out if out is not None else torch.empty(handle.cpp.num_tokens, handle.hidden,
                                                           dtype=torch.bfloat16)

        def hook():
            combined.copy_(from_dlpack(receive()))
            if wait_before is not None:
                _add_wait_ns(combine_wait_recv_cost_stats, engine.combine_wait(), wait_before)

        if return_recv_hook:
            return combined, EventOverlap(), hook
        hook()
        return combined, EventOverlap(), None

    def low_latency_query_mask_buffer(self, mask_status):
        """Writes 1 into mask_status[r] for each rank masked so far (a rank whose
        process exited, with enable_shrink), 0 for the others."""
        mask_status.zero_()
        for r in self.lost_ranks():
            mask_status[r] = 1

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        raise unsupported(self.rank, "low_latency_update_mask_buffer", "masking a rank by hand",
                          "with enable_shrink epcomm masks a rank once its process has exited, "
                          "the one state every survivor can agree on")

    def low_latency_clean_mask_buffer(self):
        raise unsupported(self.rank, "low_latency_clean_mask_buffer", "unmasking",
                          "a masked rank's process is gone; re-form the group to go on with a new one")

    def get_next_low_latency_combine_buffer(self, handle):
        """The buffer's own [E_local][R * max][H] bf16 region for the combine of
        `handle`: expert outputs written there are sent without a copy."""
        return from_dlpack(handle.engine.combine_send_buffer(handle.cpp))

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """DeepEP zeroes its signal words here. epcomm's words carry the call's
        epoch and need no cleaning; this checks the sizes against the
        engines built for them and waits for the group, so that it fails
        where DeepEP's would be misused."""
        for engine in self._low_latency.values():
            if (engine.max_tokens_per_rank, engine.hidden, engine.num_experts) == \
                    (num_max_dispatch_tokens_per_rank, hidden, num_experts):
                break
        else:
            if self._low_latency:
                raise error(self.rank, "clean_low_latency_buffer",
                            "invalid input: no low-latency dispatch ran with these sizes")
        dist.barrier(group=self.group)

    # -- engines -----------------------------------------------------------------------------

    def _host_only(self, op, tensor):
        if self._bootstrap is None:
            raise error(self.rank, op, "the Buffer was destroyed")
        if tensor.device.type != "cpu":
            raise unsupported(self.rank, op, f"a {tensor.device.type} tensor",
                              "the Python package drives the host engine only so far; "
                              "CUDA tensors need the CUDA buffers' binding")

    def _normal_engine(self, x, x_scales, topk_idx, num_experts):
        """(engine, num_experts, token type name) for x: the engine is built
        on first use; `num_experts` (None if unknown) sizes it when the Buffer
        was not told."""
        if x_scales is not None:
            kind = "fp8_e4m3"
            if x.dtype != torch.uint8 or x_scales.dtype != torch.float32:
                raise error(self.rank, "dispatch", "invalid input: fp8 x must be (uint8 tensor "
                            f"of e4m3 bytes, float32 scales), got ({x.dtype}, {x_scales.dtype})")
        elif x.dtype == torch.bfloat16:
            kind = "bf16"
        elif x.dtype == torch.float32:
            kind = "fp32"
        else:
            raise error(self.rank, "dispatch", f"invalid input: x has dtype {x.dtype}; "
                        "bfloat16, float32 or (uint8, float32 scales) for fp8")
        key, cls = (("fp32", _epcomm.NormalBuffer_f32) if kind == "fp32"
                    else ("bf16/fp8", _epcomm.NormalBuffer))
        if key in self._normal:
            return self._normal[key] + (kind,)
        sizes = dict(self._sizes)
        if sizes["num_experts"] is None:
            if num_experts is None:
                raise error(self.rank, "dispatch", "invalid input: the first dispatch needs "
                            "num_tokens_per_expert (or Buffer(num_experts=...))")
            sizes["num_experts"] = num_experts
        sizes["hidden"] = sizes["hidden"] or x.size(1)
        # DeepEP has no top-k bound and later calls may route wider than the
        # first: 16 slots unless told (MoE models route to 8 or fewer), and at
        # least one per rank for a dispatch without topk_idx.
        sizes["max_topk"] = sizes["max_topk"] or max(
            min(16, sizes["num_experts"]), topk_idx.size(1) if topk_idx is not None else 0,
            self.group_size)
        # num_nvl_bytes is the engine's byte budget, as DeepEP's: a dispatch
        # larger than the buffer moves through it in rounds, so it bounds
        # memory, not tokens.
        if sizes["max_tokens_per_rank"] is None:
            if self.num_nvl_bytes <= 0:
                raise error(self.rank, "dispatch", "invalid input: a Buffer without "
                            "num_nvl_bytes needs num_max_tokens_per_rank")
            sizes["max_tokens_per_rank"] = min(
                _TOKENS_UNDER_A_BUDGET,
                (2**31 - 1) // (self.group_size * max(sizes["max_topk"], 1)))
        engine = cls(self._bootstrap, sizes["num_experts"], sizes["hidden"], sizes["max_topk"],
                     sizes["max_tokens_per_rank"], self._timeout, self._mask_lost_ranks,
                     self.num_nvl_bytes)
        self._normal[key] = engine, sizes["num_experts"]
        return self._normal[key] + (kind,)

    def _low_latency_engine(self, use_fp8, round_scale, use_ue8m0, num_experts, hidden, topk,
                            max_tokens):
        """One engine serves bf16 and fp8 dispatches of its sizes; how fp8
        scales are rounded and laid out is part of its config, so a bf16
        call takes any engine of its sizes and an fp8 call the one of its
        scale options."""
        sizes = (num_experts, hidden, max_tokens)
        if not use_fp8:
            for (_, engine_sizes), engine in self._low_latency.items():
                if engine_sizes == sizes:
                    return engine
        key = ((round_scale, use_ue8m0), sizes)
        if key not in self._low_latency:
            # DeepEP's token-major scales (epcomm's row_major is C++ only).
            layouts = _epcomm.ScaleLayout
            layout = layouts.ue8m0 if use_ue8m0 else layouts.token_major
            self._low_latency[key] = _epcomm.LowLatencyBuffer(
                self._bootstrap, num_experts, hidden, self._sizes["max_topk"] or topk,
                max_tokens, round_scale, layout, self._timeout, self._mask_lost_ranks)
        return self._low_latency[key]
