"""The web console in headless Chromium, driven through WebDriver
(chromium-driver) against a real `gantry serve`: every flow a person uses,
by keyboard where a person would type, checked with axe-core on every page
and at 375 px wide. Run by `browser.rs`, which starts the server and passes:

CONSOLE_URL   the management listener's origin
EMAIL, PASSWORD  the first user's console credentials (printed by serve)
AXE_JS        path of axe-core's axe.min.js
SCREENSHOTS   where to write one PNG per page (optional)
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

BASE = os.environ["CONSOLE_URL"].rstrip("/")
EMAIL = os.environ["EMAIL"]
PASSWORD = os.environ["PASSWORD"]
AXE = open(os.environ["AXE_JS"], encoding="utf-8").read()
SHOTS = os.environ.get("SCREENSHOTS")
TEXT_MODEL = "smollm2-135m-instruct"
SPEECH_MODEL = "piper-en-us-joe"
IMAGE_MODEL = "dcgan-faces-64"
STT_MODEL = "whisper-tiny-en"
VIDEO_MODEL = "faces-morph-video"


def log(*args):
    print("[console.py]", *args, flush=True)


def fail(message):
    raise AssertionError(message)


options = webdriver.ChromeOptions()
options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
            "--autoplay-policy=no-user-gesture-required", "--disable-gpu", "--mute-audio",
            # A microphone that plays a tone, allowed without asking.
            "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]:
    options.add_argument(arg)
options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
driver.set_script_timeout(60)
wait = WebDriverWait(driver, 120)


def text_in(locator, text):
    """A wait condition: `text` is in the element's text. The console's
    script replaces parts of the page as they change; an element found just
    before it is replaced is read again, not an error. (Chromium reports such
    a node as "does not belong to the document" rather than as stale.)"""

    def check(d):
        try:
            return text in d.find_element(*locator).text
        except (StaleElementReferenceException, NoSuchElementException):
            return False
        except WebDriverException as e:
            if "does not belong to the document" in str(e):
                return False
            raise

    return check

checked_pages = []


def shot(name):
    """The whole page, at its full height."""
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        size = driver.get_window_size()
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size["width"], min(max(height, 600), 3000))
        driver.execute_script("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
        driver.save_screenshot(os.path.join(SHOTS, name + ".png"))
        driver.set_window_size(size["width"], size["height"])


def axe_check(name):
    """axe-core on the page as it is: no serious or critical violation."""
    driver.execute_script(AXE)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations.map(v => "
        "({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3)}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    bad = [v for v in result if v["impact"] in ("serious", "critical")]
    if bad:
        fail(f"axe on {name}: {json.dumps(bad, indent=1)}")
    log(f"axe {name}: {len(result)} minor finding(s), none serious")


def no_horizontal_scroll(name):
    width = driver.execute_script("return document.documentElement.scrollWidth")
    inner = driver.execute_script("return window.innerWidth")
    if width > inner + 1:
        fail(f"{name} scrolls sideways at {inner} px: {width} px wide")


def check_page(name, path):
    """Open a page, check it, shoot it, at desktop width and at 375 px."""
    driver.get(BASE + path)
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "main h1")))
    axe_check(name)
    shot(name)
    driver.set_window_size(375, 800)
    try:
        driver.get(BASE + path)
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "main h1")))
        no_horizontal_scroll(name)
        axe_check(name + " at 375 px")
    finally:
        driver.set_window_size(1280, 1000)
    checked_pages.append(name)


def csp_violations():
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]


def no_alert():
    try:
        text = driver.switch_to.alert.text
        fail(f"an alert ran: {text!r}")
    except NoAlertPresentException:
        pass


try:
    # ---- sign in, by keyboard ------------------------------------------------
    driver.get(BASE + "/console/keys")
    wait.until(EC.url_contains("/console/sign-in"))
    check_page("sign-in", "/console/sign-in?next=/console/keys")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)
    if "skip" not in (driver.switch_to.active_element.get_attribute("class") or ""):
        fail("the first Tab stop is not the skip link")
    email = driver.find_element(By.ID, "email")
    email.send_keys("nobody@example.test")
    driver.find_element(By.ID, "password").send_keys("not the password" + Keys.ENTER)
    wait.until(text_in((By.ID, "form-error"), "Wrong email or password"))
    driver.find_element(By.ID, "email").clear()
    driver.find_element(By.ID, "email").send_keys(EMAIL)
    driver.find_element(By.ID, "password").send_keys(PASSWORD + Keys.ENTER)
    wait.until(EC.url_contains("/console/keys"))
    log("signed in by keyboard, back at", driver.current_url)
    cookies = {c["name"]: c for c in driver.get_cookies()}
    session = cookies.get("gantry_session") or fail("no session cookie")
    if not session["httpOnly"] or session.get("sameSite") != "Strict":
        fail(f"session cookie flags: {session}")
    if driver.execute_script("return document.cookie").find("gantry_session") >= 0:
        fail("script can read the session cookie")

    # ---- API keys: create, shown once, used with curl, revoked -------------------
    check_page("keys", "/console/keys")
    driver.find_element(By.ID, "key-name").send_keys("from the browser")
    driver.find_element(By.CSS_SELECTOR, "form[data-api='/console/api/keys'] button[type=submit]").click()
    wait.until(EC.visibility_of_element_located((By.ID, "key-value")))
    key = driver.find_element(By.ID, "key-value").text.strip()
    if not key.startswith("gk_"):
        fail(f"no key shown: {key!r}")
    shot("keys-created")
    curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {key}",
                           BASE + "/v2/network-volumes"], capture_output=True, text=True, check=True)
    if curl.stdout != "200":
        fail(f"curl with the new key: {curl.stdout}")
    log("the new key works with curl")
    driver.get(BASE + "/console/keys")
    page = driver.page_source
    if key in page:
        fail("the key is shown again after creation")
    if "from the browser" not in page:
        fail("the new key is not listed")

    # ---- volumes: validation next to the field, an XSS name, rename, delete -------
    check_page("volumes", "/console/volumes")
    name = driver.find_element(By.ID, "vol-name")
    name.send_keys("<script>alert(1)</script>")
    size = driver.find_element(By.ID, "vol-size")
    size.clear()
    size.send_keys("5")
    driver.find_element(By.CSS_SELECTOR, "form[data-api$='network-volumes'] button[type=submit]").click()
    wait.until(text_in((By.ID, "err-vol-size"), "10"))
    log("size error next to its field:", driver.find_element(By.ID, "err-vol-size").text)
    if driver.find_element(By.ID, "vol-size").get_attribute("aria-invalid") != "true":
        fail("the size field is not marked invalid")
    size = driver.find_element(By.ID, "vol-size")
    size.clear()
    size.send_keys("20" + Keys.ENTER)
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, ".vol-name")))
    no_alert()
    shown = driver.find_element(By.CSS_SELECTOR, ".vol-name").text
    if shown != "<script>alert(1)</script>":
        fail(f"the volume's name is not shown as text: {shown!r}")
    shot("volumes-created")
    rename = driver.find_element(By.CSS_SELECTOR, "article.row input[name=name]")
    rename.clear()
    rename.send_keys("renamed" + Keys.ENTER)
    wait.until(text_in((By.CSS_SELECTOR, ".vol-name"), "renamed"))
    driver.find_element(By.CSS_SELECTOR, "article.row button.danger").click()
    WebDriverWait(driver, 10).until(EC.alert_is_present())
    driver.switch_to.alert.accept()
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, "article.row"))
    log("volume created, renamed and deleted")

    # ---- the text model: tokens arrive while it runs -----------------------------
    check_page("playground", "/console/playground")
    check_page("playground-text", f"/console/playground/{TEXT_MODEL}")
    driver.find_element(By.CSS_SELECTOR, "details summary").click()
    max_tokens = driver.find_element(By.ID, "in-max_tokens")
    max_tokens.send_keys("48")
    driver.find_element(By.ID, "in-message").send_keys("Write three sentences about the sea.")
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    lengths = []
    deadline = time.time() + 180
    while time.time() < deadline:
        state = driver.execute_script(
            "const r = document.querySelector('#chat .msg.assistant');"
            "return [r ? r.textContent.length : 0, document.getElementById('job-status').textContent];")
        if state[0] and (not lengths or lengths[-1] != state[0]):
            lengths.append(state[0])
        if "COMPLETED" in state[1] or "FAILED" in state[1]:
            break
        time.sleep(0.02)
    status = driver.find_element(By.ID, "job-status").text
    if "COMPLETED" not in status:
        fail(f"the text job did not complete: {status}")
    if len(lengths) < 3:
        fail(f"tokens did not arrive one by one: reply lengths seen {lengths}")
    if "cost $" not in status:
        fail(f"no cost shown: {status}")
    code = driver.find_element(By.ID, "code-openai").text
    if "chat.completions.create" not in code or "curl" not in driver.find_element(By.ID, "code-curl").text:
        fail("the code samples are missing")
    log(f"text streamed: reply lengths {lengths[:8]}… ({len(lengths)} updates); {status}")
    driver.execute_script("document.querySelectorAll('#playground details').forEach(d => d.open = false)")
    shot("playground-text-done")

    # ---- speech: an <audio> that plays ------------------------------------------
    check_page("playground-speech", f"/console/playground/{SPEECH_MODEL}")
    driver.find_element(By.ID, "in-prompt").send_keys("Hello from the Gantry console.")
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#media audio")))
    played = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; const a = document.querySelector('#media audio');"
        "a.muted = true; a.play().then(() => setTimeout(() => done({t: a.currentTime, d: a.duration, paused: a.paused}), 800))"
        ".catch(e => done({error: String(e)}));")
    if "error" in played or not played["t"] > 0 or not played["d"] > 0:
        fail(f"the speech does not play: {played}")
    log("speech plays:", played)
    shot("playground-speech-done")
    speech_url = driver.find_element(By.CSS_SELECTOR, "#media audio").get_attribute("src")

    # ---- speech to text: an uploaded file --------------------------------------------
    wav = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"console-speech-{os.getpid()}.wav")
    urllib.request.urlretrieve(speech_url, wav)
    check_page("playground-transcription", f"/console/playground/{STT_MODEL}")
    driver.find_element(By.ID, "in-audio").send_keys(wav)
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    wait.until(lambda d: any(s in d.find_element(By.ID, "job-status").text for s in ("COMPLETED", "FAILED")))
    status = driver.find_element(By.ID, "job-status").text
    output = driver.execute_script("return document.getElementById('output').textContent")
    os.remove(wav)
    if "COMPLETED" not in status or "hello" not in output.lower():
        fail(f"the upload was not transcribed: {status} {output[:300]}")
    log("uploaded speech transcribed:", json.loads(output).get("text", "")[:80])

    # ---- speech to text from the microphone (Chromium's fake device: a tone) ----------
    driver.get(BASE + f"/console/playground/{STT_MODEL}")
    record = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "[data-record]")))
    record.click()
    wait.until(text_in((By.CSS_SELECTOR, "[data-record]"), "Stop recording"))
    time.sleep(1.5)
    record.click()
    wait.until(text_in((By.CSS_SELECTOR, "[data-record]"), "Recorded"))
    recorded = driver.execute_script("return document.getElementById('in-audio').dataset.recorded || ''")
    if not recorded.startswith("UklGR"):  # base64 of "RIFF"
        fail(f"the recording is not a WAV file: {recorded[:16]!r}")
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    wait.until(lambda d: any(s in d.find_element(By.ID, "job-status").text for s in ("COMPLETED", "FAILED")))
    status = driver.find_element(By.ID, "job-status").text
    if "COMPLETED" not in status:
        fail(f"the recording was not transcribed: {status}")
    log(f"microphone: {len(recorded) * 3 // 4} bytes of WAV, {status}")
    shot("playground-transcription-done")

    # ---- an image ------------------------------------------------------------------
    check_page("playground-image", f"/console/playground/{IMAGE_MODEL}")
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#media img")))
    size = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; const img = document.querySelector('#media img');"
        "const check = () => img.complete ? done([img.naturalWidth, img.naturalHeight]) : setTimeout(check, 50); check();")
    if size != [64, 64]:
        fail(f"the image did not load: {size}")
    log("image shown:", size)
    shot("playground-image-done")

    # ---- a video that plays ---------------------------------------------------------------
    check_page("playground-video", f"/console/playground/{VIDEO_MODEL}")
    driver.find_element(By.CSS_SELECTOR, "#playground details summary").click()
    for field, value in [("duration", "1"), ("fps", "8"), ("width", "64"), ("height", "64")]:
        driver.find_element(By.ID, "in-" + field).send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#media video")))
    played = driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; const v = document.querySelector('#media video');"
        "v.muted = true; v.play().then(() => setTimeout(() => done({t: v.currentTime, d: v.duration, w: v.videoWidth}), 500))"
        ".catch(e => done({error: String(e)}));")
    if "error" in played or not played["t"] > 0 or played["w"] != 64:
        fail(f"the video does not play: {played}")
    log("video plays:", played)

    # ---- jobs, billing, the rest ---------------------------------------------------------
    check_page("jobs", "/console/jobs")
    first_job = driver.find_element(By.CSS_SELECTOR, "table a[href^='/console/jobs/']").get_attribute("href")
    driver.get(first_job)
    wait.until(EC.presence_of_element_located((By.ID, "job-state")))
    check_page("job", first_job.replace(BASE, ""))
    check_page("overview", "/console")
    if "Spend per day" not in driver.page_source:
        fail("no spend chart on the overview")
    check_page("billing", "/console/billing")
    check_page("billing-hourly", "/console/billing?bucket=hour")
    # ---- an endpoint made from a template, by the template's form ----------------------------
    def api_post(path, body):
        return json.loads(urllib.request.urlopen(urllib.request.Request(
            BASE + path, method="POST", data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})).read())
    api_post("/v2/templates", {"name": "echo-worker", "image": "gantry-test/busybox:1", "serverless": True})
    check_page("templates", "/console/templates")
    driver.find_element(By.CSS_SELECTOR, "form[data-api$='/v2/serverless'] input[name=name]").send_keys("from the console" + Keys.ENTER)
    wait.until(EC.url_to_be(BASE + "/console/endpoints"))
    if "from the console" not in driver.page_source:
        fail("the endpoint made from the template is not listed")
    log("endpoint created from a template")
    check_page("endpoints", "/console/endpoints")
    endpoint_page = driver.find_element(By.CSS_SELECTOR, "table a[href^='/console/endpoints/']").get_attribute("href")
    check_page("endpoint", endpoint_page.replace(BASE, ""))

    # ---- a pod: its page follows its log live; stop and terminate it ---------------------
    pod = api_post("/v2/pods", {"name": "console-pod", "image": "gantry-test/busybox:1", "cpu": {"id": "cpu3c", "vcpuCount": 2},
                                "args": "sh -c 'echo first line; sleep 5; echo later line; exec sleep 3600'"})["id"]
    check_page("pods", "/console/pods")
    driver.get(BASE + f"/console/pods/{pod}")
    deadline = time.time() + 120
    while "RUNNING" not in driver.find_element(By.CSS_SELECTOR, ".facts").text:
        if time.time() > deadline:
            fail("the pod never ran")
        time.sleep(0.5)
        driver.get(BASE + f"/console/pods/{pod}")
    # The page follows the log: "later line", written 5 s after the start, appears without a reload.
    wait.until(text_in((By.ID, "logs"), "later line"))
    log("pod log followed live:", driver.find_element(By.ID, "logs").text.replace("\n", " | ")[:200])
    check_page("pod", f"/console/pods/{pod}")
    wait.until(text_in((By.ID, "logs"), "first line"))
    shot("pod")
    driver.find_element(By.CSS_SELECTOR, "button.danger").click()
    WebDriverWait(driver, 10).until(EC.alert_is_present())
    driver.switch_to.alert.accept()
    wait.until(EC.url_to_be(BASE + "/console/pods"))
    log("pod terminated from its page")
    check_page("operators", "/console/admin")

    violations = csp_violations()
    if violations:
        fail("Content-Security-Policy violations: " + "; ".join(violations[:5]))

    # ---- sign out ---------------------------------------------------------------------
    driver.get(BASE + "/console")
    driver.find_element(By.CSS_SELECTOR, "form.who button").click()
    wait.until(EC.url_contains("/console/sign-in"))
    driver.get(BASE + "/console/keys")
    wait.until(EC.url_contains("/console/sign-in"))
    log("signed out; pages checked:", ", ".join(checked_pages))
    print("CONSOLE-BROWSER-OK", flush=True)
except (AssertionError, TimeoutException) as err:
    shot("failure")
    print("page at failure:", driver.current_url, file=sys.stderr)
    print(driver.page_source[:4000], file=sys.stderr)
    print("FAILED:", repr(err), file=sys.stderr)
    sys.exit(1)
finally:
    driver.quit()
