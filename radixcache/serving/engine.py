"""The request engine: prompts in, prefix reuse through the radix tree, tokens out.

Life of one request (``requests.Request``)::

    submit ─> waiting (policy order) ─admit─> running: prefill chunks ─> decodes ─> finish
                │                 match_and_pin(prompt[:-1])    │     insert(prompt + out[:-1])
                │                 allocate(m, len(prompt) + max_new - 1)         unpin(m.node)
                │                       lpm/dfs-weight: insert(prompt) at the prefill's end
                │                       (its whole blocks before it, when sharers come beside)
                └── PromptTooLarge: failed at once (RequestRejected on its handle)

Under ``--reserve grow`` (the default, ``serving.reserve``) the lease covers only what the
next step writes: each step first grows every running lease (a block per block boundary
crossed); when that growth needs more than the free and evictable blocks, it retracts the
newest running requests into the tree (``_retract``: its computed tokens inserted and held
pinned while it waits at the queue's head; a ``Retract`` event); a retracted request resumes
by prefilling its prompt and output so far, which it matches, so its output and stream go on
unchanged. A hold is dropped (its blocks evictable) only when a lease finds no block without
them.

The match is capped at ``len(prompt) - 1`` (the model needs at least one new token to produce
the first output's logits), so a full hit recomputes the last prompt token only. The last
generated token's K/V are never written: the request holds ``len(prompt) + max_new - 1``
positions and inserts exactly those tokens.

A step (``step``) asks the ``Scheduler`` (``serving.scheduler``) for its plan: it admits what
fits, in its policy's order (``fcfs``, ``lpm``, ``dfs-weight``), and returns one
``StepPlan`` (``serving.admission``), which ``Running`` (``serving.running``) executes: one
batched forward of decodes and prefill chunks (a prompt whose prefill ends is inserted at once
and the requests the plan holds for it admitted, ``Admission.release``), then the finished
requests are inserted and unpinned. When the request next in order cannot get blocks (the
pool full of pinned blocks) it unpins its match and retries next step; running requests
finish and unpin meanwhile. With nothing running, it retries without its match, so every
request that fits the pool is admitted eventually (no deadlock).

Failures: an exception inside a step fails the requests it concerns and the engine steps on:
a request's token policy or streaming hook raising fails that request, the model's forward
raising fails the requests of that forward, the tree refusing a request's admission or insert
fails that request. Each gets ``RequestFailed`` on its handle, its lease released and its
match unpinned (``_fail_running``), and a ``Fault`` event naming it; then ``check()`` runs, so
a failure that left the tree or the pins wrong raises instead. What cannot be undone raises
(``running.CorruptStep``: a forward that failed while writing blocks already in the tree) and
the stepping thread dies loudly: ``ServiceLoop``'s guard publishes a ``Fault`` and ``serve``
exits 1.

Threads: ``submit`` may be called from any thread (the HTTP front's, a workload's
follow-up from the stepping thread): it takes ``_queue``, the engine's own lock, which guards
the request ids and the totals it counts, then the scheduler's queue lock (a leaf).
Everything else (``step``, the commands, ``take_events``, ``stats``) is called by
``ServiceLoop`` under its state lock, one thread at a time, as ``CacheService`` says; a test
may call them from one thread. Tree and pool mutations happen under the tree's lock (inside
the tree), model compute outside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt
import torch

from radixcache.core import events as ev
from radixcache.core import tokens as tk
from radixcache.core.invariants import InvariantError
from radixcache.core.pool import KVPool, PoolExhausted
from radixcache.core.tree import RadixTree
from radixcache.serving.checkpoint import build_model, folder_tokenizer
from radixcache.serving.memory import MemorySource
from radixcache.serving.policy import SchedulePolicy
from radixcache.serving.requests import Answers as Answers
from radixcache.serving.requests import EngineConfig as EngineConfig
from radixcache.serving.requests import EngineError as EngineError
from radixcache.serving.requests import Request, TokenHook, feed_workload
from radixcache.serving.requests import RequestCancelled as RequestCancelled
from radixcache.serving.requests import RequestFailed as RequestFailed
from radixcache.serving.requests import RequestHandle as RequestHandle
from radixcache.serving.requests import RequestMetrics as RequestMetrics
from radixcache.serving.requests import RequestRejected as RequestRejected
from radixcache.serving.requests import RequestResult as RequestResult
from radixcache.serving.requests import StepReport as StepReport
from radixcache.serving.requests import TokenPolicy as TokenPolicy
from radixcache.serving.requests import WorkloadRun as WorkloadRun
from radixcache.serving.requests import fold_answers as fold_answers
from radixcache.serving.requests import percentiles as percentiles
from radixcache.serving.reserve import Hold, Reserve, victim
from radixcache.serving.running import Running
from radixcache.serving.scheduler import Scheduler
from radixcache.serving.service import Submitted, check_room
from radixcache.serving.stats import Stats as Stats
from radixcache.serving.tree_service import TreeService
from radixcache.traffic.workloads import Workload


class Engine(TreeService):
    """Serves requests on a model (``serving.paged.Model``: the seeded ``TinyTransformer`` or a
    checkpoint's ``LlamaDecoder``) whose K/V live in a ``KVPool`` indexed by a
    ``RadixTree`` (``engine.tree``). ``start()`` runs the scheduler thread; ``step()`` runs
    one scheduling step synchronously (tests). ``close()`` when done."""

    def __init__(self, config: EngineConfig | None = None, *,
                 memory: MemorySource | None = None) -> None:
        self.config = cfg = config or EngineConfig()
        self.model = build_model(cfg.model, cfg.checkpoint, cfg.device)
        self.text = folder_tokenizer(cfg.checkpoint)  # None: the seeded model's ids are its own
        self.model_dir = "" if cfg.checkpoint is None else str(Path(cfg.checkpoint.path).resolve())
        self.pool = KVPool(cfg.num_blocks, cfg.block_size, self.model.kv_shape(), self.model.device)
        tree = RadixTree(self.pool, high=cfg.high, low=cfg.low, record_events=cfg.record_events)
        TreeService.__init__(
            self, tree, memory if memory is not None else MemorySource(device=self.model.device),
            model=self.model.name,
            device=str(self.model.device), cache=cfg.cache)
        self._queue = threading.Lock()  # request ids and totals, against submitting threads
        self.scheduler = Scheduler(tree, self.pool, cfg, self._started, self._emit)
        self.running = Running(self.model, self.pool.kv, cfg.max_step_tokens)
        self._events: list[ev.AnyEvent] = []
        self._next_id = 0
        self._aborted: set[int] = set()  # running requests to drop at the next step

    # -- submitting --------------------------------------------------------------------------
    def submit(
        self,
        prompt_tokens: Sequence[int] | npt.NDArray[np.integer],
        max_new_tokens: int,
        forced_output: Sequence[int] | npt.NDArray[np.integer] | None = None,
        *,
        keep_logits: bool = False,
        on_token: TokenHook | None = None,
        policy: TokenPolicy | None = None,
    ) -> RequestHandle:
        """Queue a request (thread-safe) and return its handle at once.

        ``forced_output`` (teacher forcing) replaces the greedy choice of each step and must
        hold ``max_new_tokens`` tokens. Raises ``ValueError`` for an empty prompt, token ids
        outside the model's id space or ``max_new_tokens < 1``. A request that needs more
        blocks than the pool holds is not queued: its handle is already failed with
        ``RequestRejected``.
        ``on_token(token)`` is called with each output token as it is chosen, in order, from
        the stepping thread with the step lock held (streaming fronts): keep it short.
        ``policy`` chooses the tokens instead of the greedy argmax and may end the request
        early (then it finishes as if it had run out of ``max_new_tokens``).
        """
        vocab = self.model.id_space  # the tiny model folds ids past its vocabulary (model.py)
        prompt = tk.validated_array(prompt_tokens, vocab, "prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        forced = None
        if forced_output is not None:
            forced = tk.validated_array(forced_output, vocab, "forced_output")
            if forced.size != max_new_tokens:
                raise ValueError(f"forced_output holds {forced.size} tokens, not {max_new_tokens}")
        with self._queue:
            rid = self._next_id
            self._next_id += 1
            req = Request(rid, prompt, max_new_tokens, forced, keep_logits,
                           RequestHandle(rid), time.perf_counter(), on_token=on_token,
                           policy=policy)
            self.totals.submitted += 1
            need = -(-req.total // self.config.block_size)
            if need > self.config.num_blocks:
                self.totals.rejected += 1
            else:
                self.scheduler.add(req)
        if need > self.config.num_blocks:
            req.handle.settle(None, RequestRejected(
                f"request {rid}: {req.total} positions need {need} blocks;"
                f" the pool has {self.config.num_blocks}"))
        return req.handle

    def run_workload(self, workload: Workload, limit: int | None = None) -> WorkloadRun:
        """Submit the first ``limit`` (default all) requests of ``workload``; a request with
        ``after = i`` is submitted when request ``i`` is done (from the thread finishing it).
        Returns at once; ``run.wait()`` waits for all."""
        if self.text is not None:  # a checkpoint: the workload's words in the model's ids
            from radixcache.traffic.folder_tokenizer import retokenized

            workload = retokenized(workload, self.text)
        return feed_workload(self.submit, workload, limit)

    def close(self) -> None:
        """Cancel every unfinished request and close the memory source."""
        self._cancel_all()
        super().close()

    def check(self) -> None:
        """``tree.check()``, and that the tree's pins and private blocks are exactly those of
        the running requests: one pin per running request (each pins its matched node), and
        the leases' private blocks are theirs. A pin or lease that outlived its request (a
        block drawn "locked" with nothing running) raises ``InvariantError``; so does a lease
        that does not cover exactly its blocks and what its request wrote, or (``grow``) covers
        more than its next step writes. Call between
        steps, under the loop's lock."""
        self.tree.check()
        leases = [r.lease for r in self.running.requests if r.lease is not None]
        holds = len(self.scheduler.admission.holds)
        pins = sum(n.pins for n in self.tree.live_nodes()) - holds
        held = self.tree.request_blocks()
        private = {b for lease in leases for b in lease.table[lease.private_from:]}
        problems = [f"{pins} pins in the tree for {len(leases)} running requests"
                    ] if pins != len(leases) else []
        if held != private:
            problems.append(f"private blocks {sorted(held ^ private)[:8]} belong to no "
                            "running request" if held - private else
                            f"running requests' blocks {sorted(private - held)[:8]} not held")
        problems += self._lease_problems()
        if problems:
            raise InvariantError("; ".join(problems))

    def _lease_problems(self) -> list[str]:
        """Each running request's lease covers exactly its blocks, every position it wrote,
        and (``grow``) nothing past what its next step writes; (``full``) its worst case."""
        B, grow = self.config.block_size, self.config.reserve is Reserve.GROW
        out = []
        for r in self.running.requests:
            lease = r.lease
            if lease is None:
                continue
            top = r.need() if grow else r.total
            if len(lease.table) != -(-lease.total // B) or not r.computed <= lease.total <= top:
                out.append(f"request {r.id}'s lease covers {lease.total} positions in"
                           f" {len(lease.table)} blocks; it wrote {r.computed}, may hold {top}")
        return out[:4]

    def busy(self) -> bool:
        """True when ``step`` has work: running requests, or waiting ones while not paused."""
        return bool(self.running) or (bool(self.scheduler) and not self.paused)

    # -- one step ------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Admit what fits, run one batched forward (or two, see the module doc), advance
        every request in it, finish the done ones. ``ServiceLoop`` calls it under its state
        lock and publishes the events it recorded (a test may call it from one thread)."""
        t0 = time.perf_counter()
        self._drop_aborted()
        if self.config.reserve is Reserve.GROW:
            self._grow()
        plan = self.scheduler.plan(self.running.requests, paused=self.paused)
        self._start(plan.admitted, plan.rejected)
        work = self.running.step(plan, self.scheduler.admission)
        for r in work.prefilled:
            self.scheduler.admission.cache_prompt(r, plan.policy)
        for req, error in work.released.rejected:
            self._fail(req, error)
        if work.released.admitted or work.released.rejected:
            self._emit_queue()
        self._fail_running(self.running.take_failed())
        finished = self._finish(self.running.take_done())
        self.totals.steps += 1
        self.totals.prefill_tokens += work.prefill_tokens
        if work.forwards:
            self.totals.busy_s += time.perf_counter() - t0
        return StepReport(len(plan.admitted) + len(work.released.admitted), work.sequences,
                          work.prefill_tokens, work.decode_tokens, work.forwards, finished)

    # -- events --------------------------------------------------------------------------------
    def _emit(self, event: ev.AnyEvent) -> None:
        """Append an engine event after the tree events recorded so far (keeps their order)."""
        if not self.config.record_events:
            return
        self._events.extend(self.tree.take_events())
        self._events.append(event)

    def take_events(self) -> list[ev.AnyEvent]:
        """Drain every event since the last call, in order: the tree's, ``RequestStart`` /
        ``RequestFinish``."""
        out = self._events
        out.extend(self.tree.take_events())
        self._events = []
        return out

    @property
    def forward_s(self) -> float:
        """Seconds the model's forwards took since start (``ServiceLoop``'s step timeline)."""
        return self.running.forward_s

    # -- commands ------------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop admitting requests; running ones go on to finish."""
        with self._queue:
            super().pause()
        self.scheduler.note_paused()
        self._emit_queue()

    def resume(self) -> None:
        """Admit requests again."""
        with self._queue:
            super().resume()

    def depths(self) -> tuple[int, int]:
        """(waiting, running) requests now."""
        return len(self.scheduler), len(self.running)

    def set_schedule(self, policy: SchedulePolicy) -> None:
        """Order the waiting queue by ``policy`` from the next step on."""
        self.scheduler.set_policy(policy)

    def stats(self) -> Stats:
        """``TreeService.stats`` and the scheduler's figures: the policy, requests held for
        sharing or aged so far, and why the waiting ones wait now (``waiting_<reason>``)."""
        q = self.scheduler.queue().counts()
        return msgspec.structs.replace(
            super().stats(), schedule=self.scheduler.policy.value,
            held_for_sharing=self.scheduler.held, shared_in_forward=self.scheduler.shared,
            aged=self.scheduler.aged,
            waiting_order=q[ev.WaitReason.ORDER], waiting_sharing=q[ev.WaitReason.SHARING],
            waiting_pool=q[ev.WaitReason.POOL], waiting_batch=q[ev.WaitReason.BATCH],
            waiting_paused=q[ev.WaitReason.PAUSED], failed=self.totals.failed,
            model_dir=self.model_dir,
            reserve=self.config.reserve.value, retractions=self.totals.retractions,
            retracted_tokens=self.totals.retracted_tokens,
            retracted_from_tree=self.totals.retracted_from_tree,
            retracted_recomputed=self.totals.retracted_recomputed)

    def reset(self) -> int:
        """Cancel every waiting and running request (their handles fail with
        ``RequestCancelled``), then empty the tree, zero the metrics and start a new counter
        generation; returns how many requests were cancelled. The pool is entirely free
        afterwards."""
        cancelled = len(self.running) + len(self.scheduler)
        self._cancel_all()
        self._emit_queue()
        self.new_generation()
        return cancelled

    def abort(self, request_id: int) -> bool:
        """Drop one request (a client that left): a waiting one at once, a running one at the
        start of the next step, its pins and blocks released. Its handle fails with
        ``RequestCancelled``. False when no such request is waiting or running."""
        with self._queue:
            waiting = self.scheduler.take(request_id)
            running = any(r.id == request_id for r in self.running.requests)
            if waiting is None:  # running, or being admitted by the step in progress
                self._aborted.add(request_id)
        if waiting is not None:
            self._fail(waiting, RequestCancelled(f"request {waiting.id} aborted before "
                                                 "admission"))
        return waiting is not None or running

    @property
    def max_context(self) -> int:
        """The positions one request may span: the pool's, and at most the model's (a
        checkpoint's ``max_position_embeddings``)."""
        pool = self.config.num_blocks * self.config.block_size
        most = self.model.max_positions
        return min(pool, most) if most else pool

    def pinned_blocks(self) -> int:
        """Blocks the running requests hold (their block tables) and the retracted ones'
        holds keep; the rest of the used blocks are cached and evictable. A racy read for
        metrics, from any thread."""
        held = self.scheduler.admission.held_blocks()
        for r in list(self.running.requests):
            lease = r.lease
            if lease is not None:
                held.update(lease.table)
        return len(held)

    def _drop_aborted(self) -> None:
        """Release the running requests ``abort`` named (from ``step``)."""
        with self._queue:
            ids, self._aborted = self._aborted, set()
        if not ids:
            return
        gone = self.running.take(ids)
        for r in gone:
            assert r.lease is not None and r.match is not None
            self.tree.release(r.lease)
            self.tree.unpin(r.match.node)
            self._fail(r, RequestCancelled(f"request {r.id} aborted"))

    # -- the rest of the cache service (``serving.service.CacheService``) -----------------------
    def submit_workload(self, workload: Workload) -> Submitted:
        """Submit a workload's requests (dependent ones follow their predecessors), its
        answers folded into prompts under ``Answers.PREFILL``. Raises ``QueueFull`` and
        submits nothing when the waiting queue would pass ``MAX_WAITING``."""
        if self.config.answers is Answers.PREFILL:
            workload = fold_answers(workload)
        n = len(workload.requests)
        check_room(len(self.scheduler), n)
        self.run_workload(workload)
        return Submitted(n, self.paused)

    # -- admitting and finishing (the stepping thread) ----------------------------------------
    def _start(self, admitted: Sequence[Request],
               rejected: Sequence[tuple[Request, EngineError]]) -> None:
        """The plan's admitted requests join the running ones; its refused ones fail."""
        self.running.requests.extend(admitted)
        for req, error in rejected:
            self._fail(req, error)
        self._emit_queue()

    def _emit_queue(self) -> None:
        queue = self.scheduler.queue_event()
        if queue is not None:
            self._emit(queue)

    def _started(self, req: Request) -> None:
        """A request was admitted (match pinned, blocks leased): count it, say so. A retracted
        one admitted again counts what its match took back from the tree, not a new start."""
        self._drop_hold(req.id)  # its match pins what the hold kept
        if req.hit >= 0:
            back = min(req.computed, req.kept)
            self.totals.retracted_from_tree += back
            self.totals.retracted_recomputed += req.kept - back
            return
        req.admitted = time.perf_counter()
        req.hit = req.computed
        self.totals.prompt_tokens += len(req.prompt)
        self.totals.hit_tokens += req.computed
        self._emit(ev.RequestStart(req.id, len(req.prompt), req.computed))

    # -- growing leases (``serving.reserve``) ----------------------------------------------------
    def _grow(self) -> None:
        """Extend every running request's lease to what its next step writes, oldest first.
        Blocks come from the free list, then from evicting unpinned LRU blocks; when what the
        step takes exceeds what those hold, the newest running requests are retracted
        (``reserve.victim``) with a hold on what they computed (``_make_room``): they wait
        without losing it. When a lease still finds no block (pins outside the running
        requests' leases), the holds are dropped, oldest first, and then running requests
        are retracted without one, until it does."""
        admission = self.scheduler.admission
        retracted = self._make_room()
        for r in list(self.running.requests):
            while r.lease is not None:
                try:
                    self.tree.grow(r.lease, r.need())
                    break
                except PoolExhausted:
                    oldest = list(admission.holds)[:1]  # (a list: another thread may pop)
                    if oldest:
                        self._drop_hold(oldest[0])
                        continue
                    self._retract(victim(self.running.requests), hold=False)
                    retracted = True
        if retracted:
            admission.estimate.retracted(self.running.requests)
        else:
            admission.estimate.step()

    def _growth(self) -> int:
        """Blocks the running requests' leases take this step (``_grow``)."""
        B = self.config.block_size
        return sum(-(-r.need() // B) - len(r.lease.table) for r in self.running.requests
                   if r.lease is not None)

    def _make_room(self) -> bool:
        """Retract the newest running requests, each with a hold on its K/V, while the blocks
        this step's growth takes exceed the free and evictable ones (the pool less the blocks
        the leases and holds pin); a lone request is never retracted. True when one was."""
        need = self._growth()
        if need <= self.pool.free_blocks:
            return False  # the usual case: no set built
        retracted = False
        while len(self.running.requests) > 1:
            if need <= self.pool.num_blocks - self.pinned_blocks():
                break
            self._retract(victim(self.running.requests), hold=True)
            retracted = True
            need = self._growth()
        return retracted

    def _retract(self, r: Request, *, hold: bool) -> None:
        """Take ``r`` off the running batch: its computed tokens go into the tree (cache on;
        else its blocks are freed), its pin drops, and it waits at the head of the queue to
        resume where it stopped (``Request.resume``). ``hold``: what it kept stays pinned
        until it is admitted again or a step needs the blocks (``_drop_hold``), so taking it
        back is a hit; without, it is evictable at once."""
        assert r.lease is not None and r.match is not None
        self.running.take({r.id})
        held = len(r.lease.table) - r.lease.private_from
        written = r.computed if self.config.cache else 0  # K/V it leaves in the tree
        seq = np.concatenate([r.prompt, np.asarray(r.output, dtype=np.uint32)])[:written]
        if written > r.match.length:
            self.tree.insert(seq, r.lease)
        else:
            self.tree.release(r.lease)
        if hold and written:
            m = self.tree.match_and_pin(seq)
            self.scheduler.admission.holds[r.id] = Hold(m.node, frozenset(m.block_table))
        self.tree.unpin(r.match.node)
        r.retractions += 1
        r.kept = written
        self.totals.retractions += 1
        self.totals.retracted_tokens += written
        self._emit(ev.Retract(r.id, written, held))
        r.resume()
        self.scheduler.requeue(r)

    def _drop_hold(self, request_id: int) -> None:
        """Unpin a retracted request's hold (it resumed, failed, or a step needs its blocks:
        they become evictable, LRU as any). Any thread; a request without one: nothing."""
        hold = self.scheduler.admission.holds.pop(request_id, None)
        if hold is not None:
            self.tree.unpin(hold.node)

    def _fail_running(self, failed: list[Request]) -> None:
        """Fail the running requests this step failed (``Request.error``): their lease
        released, their match unpinned, their handle failed with ``RequestFailed`` and a
        ``Fault`` naming them published; the others step on. Then ``check()``: a failure
        that left the tree or the pins wrong raises (the stepping thread dies, loudly)."""
        for r in failed:
            if r.lease is not None:
                self.tree.release(r.lease)
                r.lease = None
            if r.match is not None:
                self.tree.unpin(r.match.node)
            self._fail(r, RequestFailed(f"request {r.id} failed: {r.error}"))
        if failed:
            self.check()

    def _finish(self, done: list[Request]) -> int:
        now = time.perf_counter()
        failed = []
        for r in done:
            if not self._settled(r):  # (its finish event follows its insert, as the
                failed.append(r)  # follower of the stream reads the path there)
                continue
            self.totals.finished += 1
            self.totals.output_tokens += len(r.output)
            metrics = r.metrics(now)
            self._emit(ev.RequestFinish(r.id, len(r.output), metrics.ttft_ms))
            logits = torch.stack(r.logits) if r.keep_logits else None
            r.handle.settle(RequestResult(list(r.output), metrics, logits), None)
        self._fail_running(failed)
        return len(done) - len(failed)

    def _settled(self, r: Request) -> bool:
        """``_settle_blocks``; False (``r.error`` set) when the tree raised."""
        try:
            self._settle_blocks(r)
        except Exception as exc:
            r.error = f"caching its sequence raised {type(exc).__name__}: {exc}"
            return False
        return True

    def _settle_blocks(self, r: Request) -> None:
        """Insert the request's sequence (cache on) or free its blocks; then unpin."""
        assert r.lease is not None and r.match is not None
        if self.config.cache:
            seq = np.concatenate([r.prompt, np.asarray(r.output[:-1], dtype=np.uint32)])
            self.tree.insert(seq, r.lease)
        else:
            self.tree.release(r.lease)
        self.tree.unpin(r.match.node)
        r.lease = None

    def _fail(self, req: Request, error: EngineError) -> None:
        self._drop_hold(req.id)
        if isinstance(error, RequestRejected):
            self.totals.rejected += 1
        elif isinstance(error, RequestFailed):  # said as a Fault naming it; the engine goes on
            self.totals.failed += 1
            self._emit(ev.Fault(threading.current_thread().name, str(error), req=req.id))
        else:
            self.totals.cancelled += 1
        req.handle.settle(None, error)

    def _cancel_all(self) -> None:
        """Fail every waiting and running request with ``RequestCancelled`` (step lock held)."""
        for r in self.running.take_all():
            assert r.lease is not None and r.match is not None
            self.tree.release(r.lease)
            self.tree.unpin(r.match.node)
            self._fail(r, RequestCancelled(f"request {r.id} cancelled"))
        for r in self.scheduler.drain():
            self._fail(r, RequestCancelled(f"request {r.id} cancelled before admission"))
