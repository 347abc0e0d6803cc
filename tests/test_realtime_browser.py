"""A real browser (Debian chromium, headless, via Playwright) talks to the server."""

from __future__ import annotations

import asyncio
import io
import shutil

import numpy as np
import pytest
from support.realtime import REAL_TIME_ON_A_SHARED_CPU, make_speech_wav, running_server, wait_until

from realtime.service import SERVICE

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not shutil.which(CHROMIUM), reason="Debian chromium not installed"),
]


def chromium_args(wav: str) -> list[str]:
    return [
        "--no-sandbox",
        "--disable-gpu",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
    ]


@pytest.mark.timeout(180)
@REAL_TIME_ON_A_SHARED_CPU
async def test_browser_autostart_plays_the_avatar_at_25_fps(tmp_path):
    from playwright.async_api import async_playwright

    speech = make_speech_wav(
        tmp_path / "mic.wav", [0.5, "Hello from the browser.", 0.7, "Can you hear me?", 0.5]
    )
    async with running_server() as (url, app), async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=chromium_args(str(speech.path))
        )
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/?autostart=1")
            await page.wait_for_function("window.facecastStats.ttffMs !== null", timeout=60_000)
            # Let stats polling settle, then measure decoded frames over 10 s.
            await page.wait_for_function("window.facecastStats.framesDecoded > 0", timeout=10_000)
            before = await page.evaluate("({...window.facecastStats})")
            await asyncio.sleep(10.0)
            stats = await page.evaluate("({...window.facecastStats})")
            shot = await page.locator("#avatar").screenshot()
            assert len(app[SERVICE].sessions) == 1
            (served,) = [live.stats() for live in app[SERVICE].sessions.values()]
            # a DOM click on the button itself: immune to the message line reflowing the page
            await page.locator("#disconnect").dispatch_event("click")
            try:
                await page.wait_for_function("window.facecastStats.state === 'idle'")
            except Exception as exc:
                state = await page.evaluate("({...window.facecastStats})")
                raise AssertionError(f"hang-up did not leave the page idle: {state}") from exc
        finally:
            await browser.close()
        await asyncio.sleep(1.0)
        remaining = len(app[SERVICE].sessions)

    # framesDecoded and the browser's own timestamp of that reading, ~10 s apart
    window_s = (stats["statsAtMs"] - before["statsAtMs"]) / 1000
    fps = (stats["framesDecoded"] - before["framesDecoded"]) / window_s
    assert window_s >= 9.0 and fps >= 24.0, (before, stats, served)
    assert stats["state"] == "connected" and stats["ttffMs"] > 0
    assert {"ttffMs", "framesDecoded", "fps", "freezeCount", "state"} <= set(stats)
    # the page shows the server's own counters: every frame it sent was fresh
    assert stats["freshShare"] is not None, stats
    assert float(stats["freshShare"].split()[0]) >= 98.0, served
    import av  # decode the PNG screenshot with PyAV: the video must show a picture

    with av.open(io.BytesIO(shot), format="png_pipe") as box:
        rgb = next(box.decode(video=0)).to_ndarray(format="rgb24")
    assert rgb.std() > 10 and len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50, "blank video"
    assert remaining == 0
    print("browser stats", stats, f"fps over 10 s: {fps:.1f}")


async def message_of(page) -> str:
    await page.wait_for_function("window.facecastStats.error !== null", timeout=30_000)
    return await page.evaluate("window.facecastStats.error")


@pytest.mark.timeout(180)
async def test_browser_explains_refused_token_full_server_ended_call_and_denied_mic(tmp_path):
    from playwright.async_api import async_playwright

    speech = make_speech_wav(tmp_path / "mic.wav", [0.3, "Hello.", 0.3])
    async with (
        running_server(token="right", max_sessions=1) as (url, app),
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=chromium_args(str(speech.path))
        )
        try:
            bad = await browser.new_page()
            await bad.goto(f"{url}/?autostart=1&token=wrong")
            assert "token was refused" in await message_of(bad)

            good = await browser.new_page()
            await good.goto(f"{url}/?autostart=1&token=right")
            await good.wait_for_function("window.facecastStats.state === 'connected'")
            # The token left the address bar at once; it travels in a header only.
            assert await good.evaluate("location.search") == "?autostart=1"
            extra = await browser.new_page()
            await extra.goto(f"{url}/?autostart=1&token=right")
            assert "server is full" in await message_of(extra)

            # The server ends the call (an operator deletes it): the page says so.
            await wait_until(lambda: len(app[SERVICE].sessions) == 1, 10)
            await next(iter(app[SERVICE].sessions.values())).close("deleted by the API")
            assert "ended the call" in await message_of(good)
        finally:
            await browser.close()
        # Without the fake-UI flag, headless chromium denies the microphone.
        args = [a for a in chromium_args(str(speech.path)) if "fake-ui" not in a]
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = await browser.new_page()
            await page.goto(f"{url}/?autostart=1&token=right")
            assert "Microphone access was denied" in await message_of(page)
        finally:
            await browser.close()


@pytest.mark.timeout(240)
async def test_browser_uploads_a_photo_and_explains_a_refused_one(tmp_path):
    """The page's photo upload: a photo without a face, or a file that is not an image, is
    refused with the reason; the user's own portrait starts a call of that face."""
    from playwright.async_api import async_playwright
    from support.photos import PORTRAIT, write_bad_photos

    from pipeline.config import load_config
    from pipeline.startup import load_engine

    engine = load_engine(load_config("photo"), "cpu")
    engine.warmup()
    bad = write_bad_photos(tmp_path)
    faceless = tmp_path / "wall.png"
    faceless.write_bytes(bad["faceless"][0].read_bytes())
    text = tmp_path / "notes.txt"
    text.write_text("not a photo")
    speech = make_speech_wav(tmp_path / "mic.wav", [0.3, "Hello.", 0.3])
    async with running_server(engine=engine) as (url, app), async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=chromium_args(str(speech.path))
        )
        try:
            for path, reason in ((faceless, "no face found"), (text, "PNG, JPEG or WebP")):
                page = await browser.new_page()
                await page.goto(url)
                await page.set_input_files("#photo", str(path))
                await page.locator("#connect").dispatch_event("click")
                message = await message_of(page)
                assert message.startswith("Photo refused") and reason in message, message
                await page.close()
            assert not app[SERVICE].sessions
            page = await browser.new_page()
            await page.goto(url)
            await page.set_input_files("#photo", str(PORTRAIT))
            await page.locator("#connect").dispatch_event("click")
            await page.wait_for_function("window.facecastStats.ttffMs !== null", timeout=60_000)
            assert len(app[SERVICE].photos._photos) == 1 and len(app[SERVICE].sessions) == 1
        finally:
            await browser.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_browser_frames_a_refused_photo_by_hand(tmp_path):
    """A photo the detector refuses (the portrait out of focus, its head tilted 35°): the
    page gives the server's reason as a sentence and, on a line of its own, how to fix it
    here, and shows the photo; a box dragged around the face with the mouse fills the box
    fields (photo pixels), moves, resizes, and tilts by its round handle (the tilted box
    resizes about its own corner); Connect then uploads it with X,Y,W,H,ANGLE and the call
    starts with that photo. "Frame the face" on a photo the detector does read shows its
    box and tilt, to adjust."""
    import cv2
    from playwright.async_api import async_playwright
    from support.hard_faces import tilted
    from support.photos import PORTRAIT

    from pipeline.config import load_config
    from pipeline.faces.finder import find_faces
    from pipeline.media import load_image, write_png
    from pipeline.startup import load_engine

    engine = load_engine(load_config("photo"), "cpu")
    engine.warmup()
    hard = tilted(35)  # its face box (upright in the portrait) and the turn
    photo = write_png(tmp_path / "blurred.png", cv2.GaussianBlur(hard.rgb, (0, 0), 12))
    x, y, side, _ = hard.box
    speech = make_speech_wav(tmp_path / "mic.wav", [0.3, "Hello.", 0.3])
    async with running_server(engine=engine) as (url, app), async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=chromium_args(str(speech.path))
        )
        try:
            page = await browser.new_page()
            await page.goto(url)
            await page.set_input_files("#photo", str(photo))
            await page.locator("#connect").dispatch_event("click")
            reason, fix = (await message_of(page)).split("\n")
            assert reason.startswith("Photo refused: no face found"), reason
            assert reason.endswith("on the page."), reason  # the server's sentence, whole
            assert fix.startswith("Drag a box around the face in your photo below"), fix
            shown = await page.locator("#message").inner_text()
            assert shown.splitlines() == [reason, fix], shown  # two lines on the page too
            canvas = page.locator("#framer-canvas")
            assert await canvas.is_visible()
            await canvas.scroll_into_view_if_needed()
            rect = await canvas.bounding_box()
            k = rect["width"] / hard.rgb.shape[1]  # the canvas shows the whole photo

            async def fields() -> list[float]:
                return [float(await page.locator(f"#box-{c}").input_value()) for c in "xywha"]

            async def drag(x0, y0, x1, y1, steps=4):
                await page.mouse.move(rect["x"] + x0 * k, rect["y"] + y0 * k)
                await page.mouse.down()
                await page.mouse.move(rect["x"] + x1 * k, rect["y"] + y1 * k, steps=steps)
                await page.mouse.up()

            await drag(x, y, x + side, y + side, steps=8)
            drawn = await fields()
            assert np.allclose(drawn, [x, y, side, side, 0], atol=2), (drawn, hard.box)
            # drag inside it to move it, from its corner to resize it
            cx, cy = drawn[0] + drawn[2] / 2, drawn[1] + drawn[3] / 2
            await drag(cx, cy, cx + 10, cy + 6)
            moved = await fields()
            assert np.allclose(moved, np.add(drawn, [10, 6, 0, 0, 0]), atol=1), (moved, drawn)
            corner = (moved[0] + moved[2], moved[1] + moved[3])
            await drag(*corner, corner[0] + 8, corner[1] + 8)
            resized = await fields()
            assert np.allclose(resized, np.add(moved, [0, 0, 8, 8, 0]), atol=1), (resized, moved)
            # the round handle on the top edge tilts it about its centre, clockwise
            b = resized
            cx, cy, r = b[0] + b[2] / 2, b[1] + b[3] / 2, b[3] / 2
            t = np.radians(35)
            await drag(cx, cy - r, cx + r * np.sin(t), cy - r * np.cos(t), steps=8)
            turned = await fields()
            assert np.allclose(turned, [*b[:4], 35], atol=1), (turned, b)
            # resizing a tilted box keeps its top-left corner and its tilt
            u = np.array([np.cos(t), np.sin(t)])  # the box's own x axis, in the photo
            v = np.array([-np.sin(t), np.cos(t)])  # and its y axis
            centre, half = np.array([cx, cy]), b[2] / 2
            top_left, far = centre - half * (u + v), centre + half * (u + v)
            await drag(*far, *(far + 8 * (u + v)))
            grown = await fields()
            g_centre = np.array([grown[0] + grown[2] / 2, grown[1] + grown[3] / 2])
            g_top_left = g_centre - grown[2] / 2 * (u + v)
            assert abs(grown[2] - (b[2] + 8)) <= 1 and grown[4] == 35, (grown, turned)
            assert np.linalg.norm(g_top_left - top_left) <= 1.5, (grown, turned)
            # or type the values
            typed = [int(round(x)), int(round(y)), int(round(side)), int(round(side)), 35]
            for c, value in zip("xywha", typed, strict=True):
                await page.locator(f"#box-{c}").fill(str(value))
                await page.locator(f"#box-{c}").dispatch_event("change")
            assert await fields() == typed
            assert not app[SERVICE].sessions
            await page.locator("#connect").dispatch_event("click")
            await page.wait_for_function("window.facecastStats.ttffMs !== null", timeout=60_000)
            photos = list(app[SERVICE].photos._photos.values())
            assert len(photos) == 1 and list(photos[0].photo_box) == typed, photos
            assert abs(np.degrees(photos[0].face.roll) - 35) < 1, photos[0].face
            assert len(app[SERVICE].sessions) == 1
            # "Frame the face" shows the box and the tilt the detector found
            page = await browser.new_page()
            await page.goto(url)
            await page.set_input_files("#photo", str(PORTRAIT))
            await page.locator("#frame").dispatch_event("click")
            await page.wait_for_function("document.getElementById('box-w').value !== ''")
            shown = [float(await page.locator(f"#box-{c}").input_value()) for c in "xywha"]
            found = find_faces(load_image(PORTRAIT))[0]
            assert np.allclose(shown[:4], found.box, atol=1), (shown, found.box)
            assert shown[4] == round(np.degrees(found.roll)), (shown, np.degrees(found.roll))
        finally:
            await browser.close()
