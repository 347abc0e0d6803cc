"""Playout from the latency budget: scripted engines of a set speed behind the real server,
a real aiortc client in front; what the viewer is sent is checked frame by frame."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from support.realtime import (
    REAL_TIME_ON_A_SHARED_CPU,
    ScriptedBatchingEngine,
    ScriptedEngine,
    loudness_track,
    running_server,
)

from facecast_client import FacecastClient, PcmSource
from realtime.playout import PROBE_S, plan_playout, required_delay
from realtime.service import SERVICE

RATE = 48_000
FRAME = RATE // 25  # timeline samples per video frame


class Sink:
    """What the peer is sent: each video frame (a repeat is the same array again) and the
    timeline audio, by index."""

    def __init__(self) -> None:
        self.video: list[tuple[int, np.ndarray, bool]] = []  # (index, rgb, fresh)
        self.audio: dict[int, np.ndarray] = {}
        self._last = None

    def put_video(self, frame_rgb, index):
        self.video.append((index, frame_rgb, frame_rgb is not self._last))
        self._last = frame_rgb

    def put_audio(self, pcm, sample_index):
        self.audio[sample_index] = pcm

    def audio_level(self, index: int) -> float | None:
        parts = [self.audio.get(index * FRAME + k * 960) for k in (0, 1)]
        if any(p is None for p in parts):
            return None
        pcm = np.concatenate(parts).astype(np.float64) / 32767
        return float(np.sqrt(np.mean(pcm**2)))


async def serve_scripted(engine: ScriptedEngine, seconds: float, speed: float = 1.0, **session):
    """A call of `seconds` on the scripted engine: a microphone, or an agent pushing its
    audio `speed` times faster than real time."""
    sink = Sink()

    async def attach(_session):
        return sink

    async with running_server(engine=engine, sink_factories=[attach], **session) as (url, app):
        client = FacecastClient(url, PcmSource(loudness_track(seconds + 4), speed=speed))
        await client.connect()
        await asyncio.sleep(seconds)
        live = app[SERVICE].sessions[client.session_id]
        stats = live.stats()
        budget = live.budget
        await client.close()
    # how far behind real time the client sent its audio (a loaded machine paces late):
    # the server sees that audio later, and its frames less after it, by as much
    sent = np.array(client.source.sent_at)
    live.sender_lag = float(np.median(sent - sent[0] - 0.02 * np.arange(sent.size)))
    return sink, stats, budget, live


def sync_lag(sink: Sink) -> int:
    """The lag (frames) at which fresh frames' pixels best match the audio sent with them."""
    fresh = [(i, int(rgb[0, 0, 0])) for i, rgb, new in sink.video if new]
    best, best_r = 0, -2.0
    for lag in range(-4, 5):
        pairs = [(p, sink.audio_level(i + lag)) for i, p in fresh]
        pairs = [(p, a) for p, a in pairs if a is not None]
        r = float(np.corrcoef(*zip(*pairs, strict=True))[0, 1])
        if r > best_r:
            best, best_r = lag, r
    assert best_r > 0.8, best_r
    return best


def test_budget_is_the_schedules_bound():
    engine = ScriptedEngine(rtf=0.8)
    chunk, la = engine.chunk, engine.lookahead
    g = engine.step_seconds["steady"]
    budget = plan_playout(engine.stream_step, *engine.step_seconds.values(), margin_s=0.1)
    # A live input: step 1 waits for its audio (first + chunk + lookahead frames), takes a
    # step, and must show its first frame (frame `first`) on time.
    assert budget.delay == pytest.approx((chunk + la) / 25 + g + 0.1)
    assert budget.keeps_up
    # The pre-roll lets step 0 run on silence at once: the first frame a step after start.
    steps = [engine.stream_step(k) for k in range(6)]
    soonest = required_delay(steps, *engine.step_seconds.values(), 1.0, 0.1, 10.0)
    assert budget.first_frame == pytest.approx(soonest, abs=0.04)
    assert budget.first_frame + budget.preroll == pytest.approx(budget.delay, abs=0.04)
    # Pushed five times faster, no pre-roll: the engine's own speed bounds the delay.
    pushed = plan_playout(engine.stream_step, *engine.step_seconds.values(), rate=5.0)
    assert pushed.preroll == 0 and pushed.delay < budget.delay


def test_the_first_frame_is_planned_for_when_step_0_makes_it_with_no_margin():
    """A step 0 later than planned moves the clock's start and makes no frame late, so the
    stream's first frame is planned for when step 0 makes it; the later steps' deadlines
    keep the margin, and bind when the engine is slow enough."""
    fast = ScriptedEngine(rtf=0.3)
    first, steady = fast.step_seconds["first"], fast.step_seconds["steady"]
    pushed = plan_playout(fast.stream_step, first, steady, rate=10.0, margin_s=0.1)
    step_0_audio = fast.stream_step(0).audio_frames / 25 / 10
    assert pushed.first_frame == pytest.approx(step_0_audio + first)  # no margin
    slow = ScriptedEngine(rtf=0.8)
    first, steady = slow.step_seconds["first"], slow.step_seconds["steady"]
    pushed = plan_playout(slow.stream_step, first, steady, rate=10.0, margin_s=0.1)
    step_0_ends = step_0_audio + first
    one = slow.stream_step(1)  # its audio is here before step 0 ends: it runs right after
    step_1_due = step_0_ends + steady - one.first_frame / 25
    assert pushed.first_frame == pytest.approx(step_1_due + 0.1)  # with the margin


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(60)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_pushed_call_whose_first_step_runs_late_starts_later_and_drops_nothing():
    """An agent pushing at 5x to an engine whose step 0 takes 0.3 s longer than it measured:
    the first frame leaves when it exists, later than planned by about that much, and every
    frame after is fresh and on time."""
    engine = ScriptedEngine(rtf=0.3, stalls={0: 0.3})
    sink, stats, budget, session = await serve_scripted(engine, seconds=5.0, speed=5.0)
    assert budget.preroll == 0 and budget.first_frame < 0.5  # planned with no margin
    assert stats["frames_dropped"] == 0 and stats["frames_missed"] == 0, stats
    assert stats["frames_repeated"] == 0 and stats["fresh_share"] == 1.0, stats
    late = stats["ttff_ms"] / 1000 - budget.first_frame
    assert 0.2 <= late <= 0.45, (stats["ttff_ms"], budget)
    assert sync_lag(sink) == 0


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_engine_that_keeps_up_in_bursts_has_every_frame_fresh_and_on_its_budget():
    engine = ScriptedEngine(rtf=0.8)  # whole 16-frame chunks at once, 0.8x real time
    sink, stats, budget, session = await serve_scripted(engine, seconds=9.0)
    assert stats["frames_sent"] > 150
    assert stats["frames_repeated"] == 0 and stats["frames_dropped"] == 0, stats
    assert stats["fresh_share"] == 1.0 and stats["frames_skipped"] == 0
    assert not stats["below_real_time"] and stats["engine_fps"] > 25, stats
    # the delay chosen is the budget computed from the schedule (within a frame)
    expected = plan_playout(
        engine.stream_step,
        *engine.step_seconds.values(),
        margin_s=0.1,
        start_s=PROBE_S,
        preroll_step_s=0.16,
    )
    assert budget == expected
    assert abs(session.playout_delay_s - expected.delay) <= 0.04
    # latency metrics: every frame's audio arrived `delay` before it left (less what the
    # sender lagged behind real time); the first frame left `first_frame` after the first
    # audio (scripted delays, so within 40 ms)
    lips = expected.delay - session.sender_lag
    assert abs(stats["speech_to_lips_p50_ms"] / 1000 - lips) <= 0.04, (stats, lips)
    assert abs(stats["ttff_ms"] / 1000 - expected.first_frame) <= 0.04, stats
    assert sync_lag(sink) == 0


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(60)
@REAL_TIME_ON_A_SHARED_CPU
async def test_engine_slower_than_real_time_shows_every_frame_it_makes_in_sync():
    engine = ScriptedEngine(rtf=1.25)  # 20 fps of frames, in 16-frame bursts
    seconds = 10.0
    sink, stats, _budget, _session = await serve_scripted(engine, seconds=seconds)
    made = stats["frames_generated"]
    fresh = stats["frames_fresh"]
    assert stats["frames_skipped"] > 0  # audio it could never turn into frames in time
    # the server says so (the page shows it): the engine's own rate, below the clock's
    assert stats["below_real_time"] and 18.0 <= stats["engine_fps"] <= 21.0, stats
    # fresh fps equals engine fps: what it makes is shown, not dropped as late. The frames
    # of the last burst wait in the queue for their time when the counters are read (up to
    # a step's 16): made, not yet due, and not lost
    assert stats["frames_dropped"] <= 0.05 * made, stats
    assert fresh + stats["frames_queued"] >= 0.95 * made, stats
    shown = [i for i, _rgb, new in sink.video if new]
    span = (shown[-1] - shown[0]) / 25
    assert 18.0 <= len(shown) / span <= 21.0, len(shown) / span  # the engine's 20 fps
    assert sync_lag(sink) == 0  # each frame is shown with the audio it was made from


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(60)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_slow_engine_that_stalls_keeps_its_cadence_after_with_no_burst():
    """Below real time (20 fps of frames) with one step 1.5 s late (a GPU hiccup): the viewer
    sees one longer freeze, then the same steady cadence as before, each fresh frame with its
    own audio: the stalled step's frames are not shown late or fast, the audio behind them is
    skipped, and the next steps' frames are on time."""
    engine = ScriptedEngine(rtf=1.25, stalls={6: 1.5})
    sink, stats, _budget, _session = await serve_scripted(engine, seconds=12.0)
    # the stalled step's own frames came too late to show; nothing after it was
    made = stats["frames_generated"]
    assert stats["frames_dropped"] <= engine.chunk + 0.05 * made, stats
    assert sync_lag(sink) == 0  # in sync before and after the stall
    shown = [i for i, _rgb, new in sink.video if new]
    gaps = np.diff(shown)
    # one freeze as long as the stall and a step (~60 frame times), no other beyond a step
    assert 30 <= gaps.max() <= 75, gaps.max()
    assert sorted(gaps)[-2] <= 25, sorted(gaps)[-4:]
    stall = shown[int(np.argmax(gaps))]
    before = [i for i in shown if i < stall]
    after = [i for i in shown if i > stall + 60]
    for part in (before, after):  # the engine's own rate on each side: 20 fps, no burst
        fps = len(part) / ((part[-1] - part[0]) / 25)
        assert 17.0 <= fps <= 22.0, (fps, len(part))


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(60)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_slow_engine_that_reads_a_step_ahead_shows_what_it_makes_after_its_start():
    """LiveAvatar's overlapped stream (`liveavatar.overlap`) at its H200 speed (12 frames in
    0.93 s) behind a slow first step, as served there: a backlog builds, so each step
    starts the next, whose frames then come a step later than a plain stream's. The skip
    allows for that step: after the first steps, every frame it makes is on time (before,
    two thirds of them were dropped as late, as on the GPU)."""
    engine = ScriptedEngine(rtf=1.93, first=12, chunk=12, read_ahead=True, stalls={0: 0.95})
    engine.step_seconds["first"] += 0.95
    sink, stats, _budget, _session = await serve_scripted(engine, seconds=14.0)
    made = stats["frames_generated"]
    assert stats["frames_skipped"] > 0 and made >= 120, stats
    # only the start's frames (its first three steps) can be late
    assert stats["frames_dropped"] <= 3 * engine.chunk, stats
    assert stats["frames_fresh"] + stats["frames_queued"] >= made - 3 * engine.chunk, stats
    assert sync_lag(sink) == 0


def test_a_session_opened_beside_others_plans_on_their_batched_step():
    """An engine that batches its sessions' steps measured a batch of each size; a session
    opened while another is live plans on the batch of both, its first step after the
    others' batch (it may wait for it), one alone on its own step, and an engine that
    measures no batches plans as before."""
    from types import SimpleNamespace

    from realtime.engine_timing import SERVE_SLOWDOWN, EngineTiming

    times = {"first": 0.8, "steady": 0.6, "steady_x2": 1.15, "steady_x3": 1.7}
    gpu = SimpleNamespace(type="cuda")
    engine = SimpleNamespace(step_seconds=times, stream_step=None, device=gpu)
    slow = SERVE_SLOWDOWN[("cuda", False)]
    alone, beside_one, beside_five = (EngineTiming.of(engine, sessions=n) for n in (1, 2, 6))
    assert (alone.first_seconds, alone.steady_seconds) == pytest.approx((0.8 * slow, 0.6 * slow))
    assert beside_one.steady_seconds == pytest.approx(1.15 * slow)
    assert beside_one.first_seconds == pytest.approx((0.8 + 0.6) * slow)  # after the other's
    assert beside_five.steady_seconds == pytest.approx(1.7 * slow)  # the largest batch measured
    assert beside_five.first_seconds == pytest.approx((0.8 + 1.15) * slow)  # after 2 others
    plain = SimpleNamespace(step_seconds={"first": 0.3, "steady": 0.5}, stream_step=None)
    assert EngineTiming.of(plain, sessions=3).first_seconds == EngineTiming.of(plain).first_seconds


def test_a_call_planned_for_more_than_are_there_waits_only_for_those_there():
    """`--plan-sessions`: a call planned for a batch of several plans its later steps on
    that batch, but its first step waits only for the calls sharing the engine when it
    opens: alone, for nobody, so an agent's first frame is as early as on a server planned
    for one (planned for all, an agent alone on a Pro server planned for two was due its
    first frame ~1.0 s after its first audio, where ~0.53 s was enough)."""
    from types import SimpleNamespace

    from realtime.engine_timing import EngineTiming
    from realtime.playout import plan_playout

    engine = ScriptedEngine(rtf=0.5, first=28, chunk=28)  # the schedule only
    times = {"first": 0.44, "steady": 0.46, "steady_x2": 0.93, "steady_x3": 1.37,
             "first_frames": 0.30, "steady_first_frames": 0.32}  # fmt: skip
    served = SimpleNamespace(step_seconds=times, stream_step=engine.stream_step,
                             device=SimpleNamespace(type="scripted"))  # fmt: skip
    alone = EngineTiming.of(served)
    planned_alone = EngineTiming.of(served, sessions=2, sharing=1)
    beside_one = EngineTiming.of(served, sessions=2, sharing=2)
    three_with_two = EngineTiming.of(served, sessions=3, sharing=2)
    assert planned_alone.steady_seconds == beside_one.steady_seconds == pytest.approx(0.93)
    assert planned_alone.first_seconds == pytest.approx(0.44)
    assert planned_alone.first_frames_first == pytest.approx(0.30)
    assert beside_one.first_frames_first == pytest.approx(0.30 + 0.46)
    assert three_with_two.first_seconds == pytest.approx(0.44 + 0.46)  # one other, alone
    assert three_with_two.steady_seconds == pytest.approx(1.37)
    assert EngineTiming.of(served, sessions=3).first_seconds == pytest.approx(0.44 + 0.93)
    # the worker's first estimate of its steps: the batch of those there, until more come
    assert planned_alone.steady_now == pytest.approx(0.46)
    assert three_with_two.steady_now == pytest.approx(0.93)
    assert beside_one.steady_now is None and alone.steady_now is None

    def first_frame(timing: EngineTiming) -> float:  # an agent's push, 5x real time
        return plan_playout(
            timing.step, timing.first_seconds, timing.steady_seconds, rate=5.0,
            first_frames=timing.first_frames(timing.steady_seconds),
        ).first_frame  # fmt: skip

    assert first_frame(planned_alone) < 0.6
    assert first_frame(planned_alone) == pytest.approx(first_frame(alone), abs=0.05)
    assert first_frame(beside_one) > first_frame(planned_alone) + 0.4


def test_a_call_beside_another_plans_its_first_pieces_after_the_others_work():
    """FlashHead sends a step's frames in pieces, its first piece 0.33 s into a 0.55-s step
    (the H200's figures). Beside a second call its step waits for the other's, so its first
    piece comes a whole step later: the shared plan moves the pieces by what the shared step
    adds (step 0's by the other's step, which it may wait for), and so its delay by about as
    much (on the H200, planned without that, one of two calls lost 11 % of its frames),
    while a call alone plans as before."""
    from types import SimpleNamespace

    from realtime.engine_timing import EngineTiming
    from realtime.playout import plan_playout

    engine = ScriptedEngine(rtf=0.5, first=28, chunk=28)  # the schedule only
    times = {"first": 0.50, "steady": 0.55, "steady_x2": 1.10,
             "first_frames": 0.30, "steady_first_frames": 0.33}  # fmt: skip
    served = SimpleNamespace(step_seconds=times, stream_step=engine.stream_step,
                             device=SimpleNamespace(type="scripted"))  # fmt: skip
    alone, shared = EngineTiming.of(served), EngineTiming.of(served, sessions=2)
    assert alone.first_frames(0.55) == pytest.approx((0.30, 0.33))
    assert shared.first_frames(1.10) == pytest.approx((0.30 + 0.55, 0.33 + 0.55))
    assert shared.first_seconds == pytest.approx(0.50 + 0.55)

    def delay(timing: EngineTiming) -> float:
        return plan_playout(
            timing.step,
            timing.first_seconds,
            timing.steady_seconds,
            first_frames=timing.first_frames(timing.steady_seconds),
        ).delay

    unshifted = plan_playout(engine.stream_step, 1.10, 1.10, first_frames=(0.30, 0.33)).delay
    assert delay(shared) >= delay(alone) + 0.5
    assert delay(shared) >= unshifted + 0.5


@pytest.mark.slow  # three served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_three_calls_on_a_batching_engine_at_lites_speed_are_all_fresh():
    """FlashHead Lite's batches as the H200 timed them (a 24-frame step alone 0.150 s, two
    0.279 s, three 0.256 s) behind the real server: three live calls at once, their steps
    batched by the engine's own thread, every call fresh on the server's own counters, and
    /healthz and /metrics say how many steps ran in how many batches."""
    import aiohttp

    engine = ScriptedBatchingEngine({1: 0.150, 2: 0.279, 3: 0.279}, first_seconds=0.2)
    assert engine.capacity == 3
    async with running_server(engine=engine) as (url, app):
        clients = [FacecastClient(url, PcmSource(loudness_track(16, seed=i))) for i in range(3)]
        for client in clients:
            await client.connect()
        await asyncio.sleep(12)
        stats = [app[SERVICE].sessions[c.session_id].stats() for c in clients]
        for client in clients:
            await client.close()
        await asyncio.sleep(0.5)  # a step under way ends
        async with aiohttp.ClientSession() as http:
            health = await (await http.get(f"{url}/healthz")).json()
            metrics = await (await http.get(f"{url}/metrics")).text()
    for call in stats:
        assert call["frames_sent"] > 200 and call["frames_missed"] == 0, call
        assert call["frames_fresh"] >= 0.99 * call["frames_sent"], call
    assert health["batched_steps"] >= health["batches"] == len(engine.batch_sizes) > 20
    assert health["batched_steps"] == sum(engine.batch_sizes)
    assert f"facecast_engine_batched_steps {float(health['batched_steps'])}" in metrics


@pytest.mark.slow  # four served calls for seconds
@pytest.mark.timeout(120)
@REAL_TIME_ON_A_SHARED_CPU
async def test_four_calls_whose_served_steps_outlast_the_warm_ups_line_up_rather_than_grow_a_cycle():
    """FlashHead Lite's four calls as an H100 served them in the engine's own process: each
    step's frames reach its call 0.1 s after its batch (the warm-up timed 0.18 s, served
    0.28-0.36 s), so after the first utterance every call needs a little more delay. Keeping
    each call's place in the 0.96-s cycle took a whole cycle more (2.2 s on the GPU); the
    calls line up on the step they share instead, every frame still fresh, each delay near
    the shared plan's 1.5 s."""
    from facecast_client import read_pcm

    engine = ScriptedBatchingEngine(
        {1: 0.177, 2: 0.279, 3: 0.30, 4: 0.34}, first_seconds=0.189, transfer=0.10
    )
    speech = read_pcm(Path(__file__).parents[1] / "pipeline/assets/sample_speech.wav")
    async with running_server(engine=engine, max_sessions=4) as (url, app):
        clients = []
        for _ in range(4):
            clients.append(FacecastClient(url, PcmSource(speech, loop=True)))
            await clients[-1].connect()
            await asyncio.sleep(0.7)
        await asyncio.sleep(12)
        stats = [app[SERVICE].sessions[c.session_id].stats() for c in clients]
        lined_up = app[SERVICE].cycle.lined_up
        for client in clients:
            await client.close()
    assert lined_up
    for call in stats:
        assert call["frames_sent"] > 250 and call["frames_missed"] == 0, call
        assert call["frames_fresh"] >= 0.99 * call["frames_sent"], call
        assert call["playout_delay_now_ms"] < 1900, call  # a whole cycle's growth: ~2.3 s


# FlashHead Pro's `fp8-fast` steps as the H200 timed them at warm-up (a 28-frame step alone
# 0.524 s, a batch of two 1.033 s, a first step 0.478 s;
# `bench/results/flashhead/bench_pro_fp8fast_same_run_as_authors_h200.json`): two calls need
# 94 % of the GPU; their steps come due together, or take turns in the 1.12-s chunk.
PRO_FP8_ON_THE_H200, PRO_FP8_FIRST_ON_THE_H200 = {1: 0.524, 2: 1.033}, 0.478


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_two_calls_opened_at_once_take_turns_and_stay_fresh():
    """Two offers negotiated at the same moment. The first to start plans on a step of its
    own, and the second places its steps half a chunk from the first's: a steady tone has no
    pause in which a delay could grow, so only where their steps fall keeps them fresh (on
    the H200, two calls that each planned alone with nothing to keep their steps apart were
    70 % fresh; planned on the shared step, fresh at 2.1 s of delay)."""
    engine = ScriptedBatchingEngine(
        PRO_FP8_ON_THE_H200, first_seconds=PRO_FP8_FIRST_ON_THE_H200, chunk=28
    )
    async with running_server(engine=engine, max_sessions=2) as (url, app):
        clients = [FacecastClient(url, PcmSource(loudness_track(20, seed=i))) for i in range(2)]
        await asyncio.gather(*(client.connect() for client in clients))
        await asyncio.sleep(12)
        live = [app[SERVICE].sessions[c.session_id] for c in clients]
        stats = [call.stats() for call in live]
        dues = [call.playout.steps_due() for call in live]
        for client in clients:
            await client.close()
    for call in stats:
        assert call["frames_sent"] > 200 and call["frames_missed"] == 0, call
        assert call["frames_fresh"] >= 0.99 * call["frames_sent"], call
        assert call["playout_delay_now_ms"] < 1900, call  # not the shared step's ~2.1 s
    assert None not in dues and abs((dues[1] - dues[0]) % (28 / 25) - 0.56) <= 0.16, dues


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_an_agent_alone_on_a_server_planned_for_two_is_early_and_skips_nothing():
    """`--plan-sessions 2` with Pro's steps as the H200 timed them (alone 0.49 s, its first
    4 frames 0.31 s in; two together 0.97 s): an agent alone pushes its answer at 5x. Its
    first step runs alone, so its first frame comes as early as on a server planned for one
    (~0.58 s), and its worker, expecting steps of its own until others join, skips nothing
    (expecting the shared step, it skipped 4 of 93 frames it would have made in time)."""
    engine = ScriptedBatchingEngine(
        {1: 0.49, 2: 0.97}, first_seconds=0.45, chunk=28, piece_share=0.63
    )
    _, stats, _, _ = await serve_scripted(
        engine, seconds=6.0, speed=5.0, max_sessions=2, plan_sessions=2
    )
    said = {k: v for k, v in stats.items() if k.startswith(("frames", "playout", "ttff"))}
    assert stats["frames_skipped"] == 0 and stats["frames_missed"] == 0, said
    assert stats["frames_sent"] > 100 and stats["frames_fresh"] >= 0.98 * stats["frames_sent"], said
    assert stats["ttff_ms"] < 750, said


async def a_second_call_joins(
    piece_share: float | None = None, second_speed: float = 1.0, **server
) -> tuple[list[dict], list[dict], list[dict], float]:
    """Two calls on a server with Pro's fp8-fast H200 step times (`piece_share`: its steps' frames in
    pieces, the first that share of a step into it), the second joining 3 s after the first
    (a microphone, or an agent pushing at `second_speed`): the first's `delay_grown` events
    before the join and by the end, both calls' stats (the first's before the join first),
    and how far apart in the 1.12-s chunk their steps come due (seconds, the second after
    the first; None where either has no place: an agent's)."""
    engine = ScriptedBatchingEngine(
        PRO_FP8_ON_THE_H200,
        first_seconds=PRO_FP8_FIRST_ON_THE_H200,
        chunk=28,
        piece_share=piece_share,
    )
    async with running_server(engine=engine, max_sessions=2, **server) as (url, app):
        first = FacecastClient(url, PcmSource(loudness_track(20, seed=0)))
        await first.connect()
        await asyncio.sleep(3)
        grown_alone = [e for e in first.events if e["type"] == "delay_grown"]
        alone = app[SERVICE].sessions[first.session_id].stats()
        track = PcmSource(loudness_track(20, seed=1), speed=second_speed)
        second = FacecastClient(url, track)
        await second.connect()
        await asyncio.sleep(10)
        live = [app[SERVICE].sessions[c.session_id] for c in (first, second)]
        stats = [call.stats() for call in live]
        dues = [call.playout.steps_due() for call in live]
        grown = [e for e in first.events if e["type"] == "delay_grown"]
        for client in (first, second):
            await client.close()
    for n, call in enumerate(stats, 1):
        said = {k: v for k, v in call.items() if k.startswith(("frames", "playout"))}
        assert call["frames_sent"] > 200 and call["frames_missed"] == 0, (n, said)
        assert call["frames_fresh"] >= 0.99 * call["frames_sent"], (n, said, grown)
    apart = None if None in dues else (dues[1] - dues[0]) % (28 / 25)
    return grown_alone, grown, [alone, *stats], apart


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_second_live_call_takes_its_steps_half_a_chunk_away_and_neither_waits():
    """A call alone plans on a step of its own. A second microphone joins and takes less
    pre-roll, so that its steps come due about half a chunk from the first's: each runs
    while the other waits for its audio (Pro's 0.52-s steps, twice, fit the 1.12-s chunk).
    So neither plans on the step of both: the first never grows its delay, the second
    starts at about the first's (on the H200, planned on the shared step, both had 2.1 s
    of speech-to-lips where one alone had 1.6), and both stay fresh."""
    grown_alone, grown, (alone, first, second), apart = await a_second_call_joins()
    assert grown == grown_alone, grown  # the pre-roll only
    assert first["playout_delay_now_ms"] == first["playout_delay_ms"], first
    assert abs(second["playout_delay_ms"] - alone["playout_delay_ms"]) < 250, (alone, second)
    assert apart is not None and abs(apart - 0.56) <= 0.16, apart  # half a chunk, give or take


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_call_planned_alone_grows_its_delay_when_an_agent_joins():
    """An agent pushes its answer 5x faster than real time: its steps run back to back and
    no place in the chunk keeps clear of them. The call already there raises its delay to
    the step both share at its peer's next pause (here at once: a tone is no speech) and
    tells the peer; both stay fresh."""
    grown_alone, grown, (_, first, _), apart = await a_second_call_joins(second_speed=5.0)
    assert apart is None
    assert len(grown) > len(grown_alone), grown  # the pre-roll, then the growth after the join
    assert grown[-1]["delay_ms"] > grown_alone[-1]["delay_ms"] + 300, grown
    assert first["playout_delay_now_ms"] > first["playout_delay_ms"], first


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_call_sending_frames_in_pieces_keeps_its_delay_when_a_second_call_joins():
    """Pro's steps send their first 4 frames 0.31 s into a 0.52-s step, as on the H200. A
    call alone plans on that first piece. Had a second call's steps come due with its own,
    the piece would come a step later (on the H200, re-planned without that wait, a call
    lost 11 % of its frames); placed half a chunk away, they never do: the first call keeps
    its delay and both stay fresh."""
    grown_alone, grown, _, apart = await a_second_call_joins(piece_share=0.6)
    assert grown == grown_alone, grown
    assert apart is not None and abs(apart - 0.56) <= 0.16, apart  # half a chunk, give or take


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_a_server_planning_for_two_calls_gives_the_first_the_shared_delay_from_its_start():
    """`--plan-sessions 2`: a call alone is planned for the step two calls share, so when a
    second joins it has nothing to grow: no `delay_grown` after its pre-roll, its delay as
    it started, the second's the same, and both calls fresh, with no pause needed (a tone
    has none)."""
    _, grown, (alone, first, second), _ = await a_second_call_joins(plan_sessions=2)
    assert len(grown) == 1, grown  # the pre-roll only
    assert first["playout_delay_now_ms"] == first["playout_delay_ms"], first
    assert abs(alone["playout_delay_ms"] - second["playout_delay_ms"]) < 200, (alone, second)


def stub_playout(
    timing,
    step_seconds: float,
    send=None,
    ingest=None,
    session_id: str = "",
    cycle=None,
    agent_speech=lambda: False,
):
    """A `PlayoutControl` on its own: a frame queue of which only the lead is read, metrics
    that take what they are given, `send` and `ingest` (the peer, the timeline) as given or
    dropped, the engine's step measured at `step_seconds`, among the calls of `cycle`, its
    peer speaking through utterances where `agent_speech()`."""
    from types import SimpleNamespace

    from realtime.playout import PlayoutControl

    return PlayoutControl(
        timing,
        SimpleNamespace(lead=0),
        SimpleNamespace(playout_delay=SimpleNamespace(observe=lambda s: None)),
        send or (lambda text: None),
        ingest or (lambda pcm, arrived: None),
        lambda: step_seconds,
        margin_s=0.05,
        session_id=session_id,
        cycle=cycle,
        agent_speech=agent_speech,
    )


def test_a_call_retimed_before_its_first_frame_starts_at_the_shared_delay():
    """A second call joins after a call's delay was planned but before its first frame:
    nothing is shown yet, so its first frame comes later by what the shared step needs, and
    the call starts at that delay instead of growing to it at a pause (dropping frames late
    until then)."""
    import time

    from realtime.engine_timing import EngineTiming

    engine = ScriptedEngine(rtf=0.4)
    first, steady = engine.step_seconds["first"], engine.step_seconds["steady"]
    alone = EngineTiming(engine.stream_step, first, steady)
    shared = EngineTiming(engine.stream_step, 2 * steady, 2 * steady)

    started_alone, joined = stub_playout(alone, steady), stub_playout(alone, steady)
    for playout in (started_alone, joined):
        playout.first_audio = time.monotonic()  # the first frames ready at once: t0 as planned
        playout.decide_start(playout.first_audio)
    joined.retime(shared)  # planned, not started
    for playout in (started_alone, joined):
        playout.start()
    assert started_alone.delay_s is not None and joined.delay_s is not None
    want = plan_playout(engine.stream_step, 2 * steady, 2 * steady, margin_s=0.05).delay
    assert joined.delay_s == pytest.approx(want, abs=0.01)
    assert joined.delay_s > started_alone.delay_s + 0.1
    joined.grow(0, joined.clock.t0 - joined.delay_s, quiet=True)
    assert joined.grown_s == 0  # nothing left to grow


def test_a_started_call_re_plans_on_its_later_steps_only():
    """A call's step 0 (the first chunk's shape, and beside others a wait for their step)
    is behind it once it has started: a re-plan grows the delay to what its later steps
    need, however long a first step would take, while a call not yet started plans on both."""
    import time

    from realtime.engine_timing import EngineTiming

    engine = ScriptedEngine(rtf=0.4)
    steady = engine.step_seconds["steady"]
    slow_first = EngineTiming(engine.stream_step, 3.0, steady, 0.0, 2.5, 0.6 * steady)
    playout = stub_playout(slow_first, steady)
    unstarted = playout.plan().delay
    playout.first_audio = time.monotonic()
    playout.decide_start(playout.first_audio)
    playout.start()
    later_only = plan_playout(
        engine.stream_step, steady, steady, margin_s=0.05,
        first_frames=(0.6 * steady, 0.6 * steady),
    ).delay  # fmt: skip
    assert playout.plan().delay == pytest.approx(later_only)
    assert unstarted > later_only + 1.0  # step 0's 2.5 s to its first frames


def test_a_started_call_retimed_to_a_longer_shared_step_grows_its_delay_when_quiet(caplog):
    """`PlayoutControl.retime`: a call planned alone learns that its steps now take a batch's
    time (a second call joined); its delay target rises to the plan for that step and is
    reached the next time nobody speaks, told to the peer and said in the log; a shorter
    step changes nothing."""
    import json
    import time

    from realtime.engine_timing import EngineTiming

    engine = ScriptedEngine(rtf=0.4)
    first, steady = engine.step_seconds["first"], engine.step_seconds["steady"]
    alone = EngineTiming(engine.stream_step, first, steady)
    shared = EngineTiming(engine.stream_step, 2 * steady, 2 * steady)
    sent, inserted = [], []
    playout = stub_playout(
        alone, steady, sent.append, lambda pcm, arrived: inserted.append(pcm.size), "call-1"
    )
    caplog.set_level("INFO", logger="realtime.playout")
    playout.first_audio = time.monotonic()
    playout.decide_start(playout.first_audio)  # planned alone, at the live rate
    playout.start()
    assert playout.delay_s is not None
    before = playout.delay_s + playout.grown_s
    playout.retime(EngineTiming(engine.stream_step, first, steady / 2))  # faster: nothing
    playout.grow(0, playout.clock.t0, quiet=True)
    assert playout.grown_s == 0
    playout.retime(shared)
    playout.grow(0, playout.clock.t0, quiet=False)  # someone speaks: not yet
    assert playout.grown_s == 0
    last_rx = playout.clock.t0 - before  # the newest audio sees today's delay
    playout.grow(0, last_rx, quiet=True)
    target = plan_playout(engine.stream_step, 2 * steady, 2 * steady, margin_s=0.05).delay
    assert playout.grown_s > 0 and before + playout.grown_s == pytest.approx(target, abs=0.17)
    grown = [json.loads(m) for m in sent if '"delay_grown"' in m]
    assert len(grown) == 2 and inserted[-1] > 0  # the pre-roll at the start, then the growth
    assert grown[-1]["delay_ms"] == pytest.approx(1000 * (before + playout.grown_s), abs=2)
    said = [r.getMessage() for r in caplog.records if "call-1" in r.getMessage()]
    assert len(said) == 3, said  # the longer step, the target, the growth: an operator's trail
    assert "grown to" in said[-1]
    # an agent's call, planned for audio pushed 10x faster than real time, keeps its delay
    agent = stub_playout(alone, steady, sent.append, lambda pcm, arrived: 0)
    agent.first_audio = now = time.monotonic()
    agent.probe(np.zeros(48_000, np.int16), now + 2 * PROBE_S, now)  # 1 s of audio at once
    agent.start()
    assert agent.pushed and agent.delay_s is not None
    agent.retime(shared)
    agent.grow(0, agent.clock.t0 - agent.delay_s, quiet=True)
    assert agent.grown_s == 0


def test_a_microphone_joining_a_started_call_gives_up_pre_roll_to_take_turns_with_it():
    """Pro's steps (0.52 s in a 1.12-s chunk): the joining call takes less pre-roll, so that
    its steps come due about half a chunk from the other's, and plans on a step of its own
    (and what it waits, if anything), not on the step of both: its delay is about the
    first's. Growing later, keeping that place would cost it a whole chunk (0.52-s steps
    leave no other place clear), lining both calls up on the step they share about half:
    they line up."""
    import time

    from realtime.engine_timing import EngineTiming
    from realtime.stagger import StepCycle

    engine = ScriptedEngine(rtf=0.52 * 25 / 28, first=28, chunk=28)
    alone = EngineTiming(engine.stream_step, 0.48, 0.52)
    shared = EngineTiming(engine.stream_step, 0.48 + 0.52, 1.04)
    cycle = StepCycle(28 / 25, alone, lambda calls: shared)
    first = stub_playout(alone, 0.52, session_id="first", cycle=cycle)
    first.first_audio = time.monotonic() - 5.3  # its steps due at any place in the chunk
    first.decide_start(first.first_audio)
    first.start()
    joined = stub_playout(shared, 0.52, session_id="joined", cycle=cycle)  # as negotiated
    joined.first_audio = time.monotonic()
    joined.decide_start(joined.first_audio)
    assert first.timing == alone  # nothing of the joining call's is in its way

    def apart() -> float:
        due, theirs = joined.steps_due(), first.steps_due()
        assert due is not None and theirs is not None
        return (due - theirs) % (28 / 25)

    assert abs(apart() - 0.56) <= 0.16, apart()
    assert joined.timing.steady_seconds <= 0.52 + 0.1
    assert joined.budget is not None and first.budget is not None
    assert joined.preroll_s <= first.preroll_s  # it gave up pre-roll, never added delay
    assert joined.budget.delay == pytest.approx(first.budget.delay, abs=0.2)
    shared_delay = plan_playout(engine.stream_step, 1.0, 1.04, margin_s=0.05).delay
    assert joined.budget.delay < shared_delay - 0.4
    # a re-plan on longer steps: it grows by what the shared step needs, less than a chunk,
    # and the other call re-plans on that step too (it grows at its own next pause)
    joined.start()
    assert joined.delay_s is not None
    joined.retime(EngineTiming(engine.stream_step, 0.48, 0.75))
    joined.grow(0, joined.clock.t0 - joined.delay_s, quiet=True)
    assert 0 < joined.grown_s < 28 / 25 - 0.16
    assert cycle.lined_up and first.timing == shared and joined.timing == shared
    assert joined.plan().delay <= joined.delay_s + joined.grown_s + 0.02  # nothing left


def test_a_call_whose_peer_begins_to_speak_through_utterances_makes_the_others_share_its_steps():
    """An agent's call started as a microphone's (real time, its steps in a place of their
    own) and then sends its answers as utterances, faster than real time: its steps come
    back to back, so the call beside it is re-planned on the step both share, once."""
    import time

    from realtime.engine_timing import EngineTiming
    from realtime.stagger import StepCycle

    engine = ScriptedEngine(rtf=0.52 * 25 / 28, first=28, chunk=28)
    alone = EngineTiming(engine.stream_step, 0.48, 0.52)
    shared = EngineTiming(engine.stream_step, 0.48 + 0.52, 1.04)
    cycle = StepCycle(28 / 25, alone, lambda calls: shared)
    utterances = [False]
    calls = [
        stub_playout(alone, 0.52, session_id="mic", cycle=cycle),
        stub_playout(alone, 0.52, session_id="agent", cycle=cycle,
                     agent_speech=lambda: utterances[0]),
    ]  # fmt: skip
    for call in calls:
        call.first_audio = time.monotonic()
        call.decide_start(call.first_audio)
        call.start()
    calls[1].tick()
    assert calls[0].timing == alone and calls[1].steps_due() is not None
    utterances[0] = True
    calls[1].tick()
    assert calls[0].timing == shared and calls[1].steps_due() is None
    calls[0].timing = alone
    calls[1].tick()  # said once
    assert calls[0].timing == alone


@pytest.mark.slow  # two served calls for seconds
@pytest.mark.timeout(90)
@REAL_TIME_ON_A_SHARED_CPU
async def test_an_agent_beside_a_call_sending_frames_in_pieces_skips_nothing():
    """Pro's steps send their first 4 frames 0.31 s into a 0.52-s step. An agent pushing at
    5x joins a live call: its steps wait out the call's, and its backlog is skipped only
    where frames would be late. Frames in a step's first piece exist before the step ends,
    so audio they show is not skipped for want of the step's end (skipped, the agent's
    frames there repeat)."""
    _, _, (_, first, agent), _ = await a_second_call_joins(piece_share=0.6, second_speed=5.0)
    assert agent["frames_skipped"] == 0 and first["frames_skipped"] == 0, (first, agent)
