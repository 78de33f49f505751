// Gantry console: the few things a page does beyond links and forms.
// No build step and no library; served from /console/assets under a CSP
// that allows no inline script. Everything users typed is shown with
// textContent, never as HTML.
"use strict";
(function () {
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  async function call(method, url, body) {
    const init = { method, headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(url, init);
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = { detail: text }; }
    return { ok: res.ok, status: res.status, data };
  }

  function clearProblem(scope) {
    scope.querySelectorAll("[data-error-for]").forEach((el) => { el.textContent = ""; });
    scope.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
  }

  // Puts a problem's messages next to the fields they name ("name: ..."
  // goes to [data-error-for="name"]); the rest into the form's general slot.
  function showProblem(scope, problem, status) {
    clearProblem(scope);
    const general = scope.querySelector('[data-error-for=""]');
    const errors = (problem && Array.isArray(problem.errors)) ? problem.errors : [];
    const rest = [];
    for (const message of errors) {
      const i = message.indexOf(":");
      // The API names a body field as "$.size"; a model's input as "input.prompt".
      const field = i > 0 ? message.slice(0, i).trim().replace(/^\$\./, "") : "";
      const slot = field && scope.querySelector('[data-error-for="' + CSS.escape(field) + '"]');
      if (slot) {
        slot.textContent = (slot.textContent ? slot.textContent + " " : "") + message.slice(i + 1).trim();
        const input = scope.querySelector('[name="' + CSS.escape(field.replace(/^input\./, "")) + '"]');
        if (input) input.setAttribute("aria-invalid", "true");
      } else {
        rest.push(message);
      }
    }
    if (!errors.length || rest.length) {
      const detail = rest.length ? rest.join("; ") : ((problem && (problem.detail || problem.title)) || ("request failed (" + status + ")"));
      if (general) general.textContent = detail; else window.alert(detail);
    }
    const first = scope.querySelector('[aria-invalid="true"]');
    if (first) first.focus();
  }

  // A form's fields as JSON: data-type says how to read a value; empty
  // optional fields are left out; checkboxes sharing a name make a list.
  async function formJson(form, prefix) {
    const out = {};
    // "workers.min" goes to {workers: {min: …}}.
    const put = (name, value) => {
      const parts = name.split(".");
      let at = out;
      for (const part of parts.slice(0, -1)) at = (at[part] = at[part] || {});
      at[parts[parts.length - 1]] = value;
    };
    for (const el of form.elements) {
      if (!el.name || el.disabled || el.type === "submit" || el.type === "button" || el.dataset.chat) continue;
      const type = el.dataset.type || "";
      if (el.type === "checkbox" && !type) {
        if (!Array.isArray(out[el.name])) out[el.name] = [];
        if (el.checked) out[el.name].push(el.value);
        continue;
      }
      if (type === "bool") { if (el.checked) out[el.name] = true; else if (!prefix) out[el.name] = false; continue; }
      if (type === "base64") {
        if (el.dataset.recorded) { out[el.name] = el.dataset.recorded; continue; }
        if (el.files && el.files[0]) out[el.name] = await fileBase64(el.files[0]);
        continue;
      }
      const value = el.value.trim();
      if (value === "") { if (!prefix && type === "number") out[el.name] = null; continue; }
      if (el.name.includes(".")) { put(el.name, type === "number" ? Number(value) : el.value); continue; }
      if (type === "number") out[el.name] = Number(value);
      else if (type === "json") { try { out[el.name] = JSON.parse(value); } catch (_) { out[el.name] = value; } }
      else if (type === "lines") out[el.name] = value.split("\n").map((s) => s.trim()).filter(Boolean);
      else out[el.name] = el.value;
    }
    return out;
  }

  function fileBase64(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  async function act(el, body) {
    if (el.dataset.confirm && !window.confirm(el.dataset.confirm)) return;
    const scope = el.closest("form") || el.closest("article") || document;
    const buttons = el.tagName === "FORM" ? el.querySelectorAll("button") : [el];
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const res = await call(el.dataset.method || "POST", el.dataset.api, body);
      if (!res.ok) { showProblem(scope, res.data, res.status); return; }
      if (el.dataset.then === "show-key" && res.data && res.data.key) {
        const box = document.getElementById("key-once");
        document.getElementById("key-value").textContent = res.data.key;
        box.hidden = false;
        el.reset();
        box.querySelector("button").focus();
        return;
      }
      if (el.dataset.then && el.dataset.then.startsWith("/console")) { window.location.assign(el.dataset.then); return; }
      window.location.reload();
    } catch (err) {
      showProblem(scope, { detail: String(err) }, 0);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (form.id === "playground") { event.preventDefault(); run(form); return; }
    if (!form.dataset.api) return;
    event.preventDefault();
    act(form, await formJson(form, false));
  });

  document.addEventListener("click", (event) => {
    const copy = event.target.closest("[data-copy]");
    if (copy) {
      const text = document.getElementById(copy.dataset.copy).textContent;
      navigator.clipboard.writeText(text).then(() => { copy.textContent = "Copied"; }, () => { copy.textContent = "Select and copy"; });
      return;
    }
    const record = event.target.closest("[data-record]");
    if (record) { toggleRecording(record); return; }
    const button = event.target.closest("button[data-api]");
    if (button) act(button, button.dataset.body ? JSON.parse(button.dataset.body) : undefined);
  });

  // ---- media found in a job's output ------------------------------------
  function mediaKind(url) {
    let type = "";
    try { type = new URL(url, location.href).searchParams.get("type") || ""; } catch (_) { return ""; }
    const path = url.split("?")[0].toLowerCase();
    if (type.startsWith("image/") || /\.(png|jpe?g|webp|gif)$/.test(path)) return "img";
    if (type.startsWith("audio/") || /\.(wav|flac|ogg|mp3)$/.test(path)) return "audio";
    if (type.startsWith("video/") || /\.(mp4|webm)$/.test(path)) return "video";
    return "";
  }

  function showMedia(target, output) {
    target.textContent = "";
    const seen = new Set();
    (function walk(value) {
      if (typeof value === "string" && /^https?:\/\//.test(value) && !seen.has(value)) {
        seen.add(value);
        const kind = mediaKind(value);
        if (!kind) return;
        const el = document.createElement(kind);
        el.src = value;
        if (kind === "img") el.alt = "Generated image";
        else { el.controls = true; el.preload = "auto"; }
        target.appendChild(el);
        const link = document.createElement("a");
        link.href = value; link.textContent = "Download (the link expires)";
        target.appendChild(link);
      } else if (value && typeof value === "object") {
        Object.values(value).forEach(walk);
      }
    })(output);
  }

  // ---- the playground ---------------------------------------------------
  const history = [];
  let current = null;

  function say(text) { const s = document.getElementById("job-status"); if (s) s.textContent = text; }

  function bubble(role, text) {
    const chat = document.getElementById("chat");
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.textContent = text;
    chat.appendChild(div);
    return div;
  }

  function snippets(form, input) {
    const model = form.dataset.model;
    const origin = document.getElementById("code-curl").dataset.origin;
    const body = JSON.stringify({ input });
    document.getElementById("code-curl").textContent =
      "curl -s " + origin + "/v2/" + model + "/runsync \\\n  -H \"Authorization: Bearer $GANTRY_API_KEY\" \\\n  -H 'Content-Type: application/json' \\\n  -d '" + body.replace(/'/g, "'\\''") + "'";
    document.getElementById("code-runpod").textContent =
      "import os, runpod\nrunpod.api_key = os.environ[\"GANTRY_API_KEY\"]\nrunpod.endpoint_url_base = \"" + origin + "/v2\"\n" +
      "endpoint = runpod.Endpoint(\"" + model + "\")\nprint(endpoint.run_sync(" + JSON.stringify(input, null, 1).replace(/\btrue\b/g, "True").replace(/\bfalse\b/g, "False").replace(/\bnull\b/g, "None") + "))";
    const openai = document.getElementById("code-openai");
    if (openai && form.dataset.kind === "embedding") {
      openai.textContent =
        "import os\nfrom openai import OpenAI\nclient = OpenAI(base_url=\"" + origin + "/v2/" + model + "/openai/v1\", api_key=os.environ[\"GANTRY_API_KEY\"])\n" +
        "result = client.embeddings.create(model=\"" + model + "\", input=" + JSON.stringify(input.input === undefined ? "" : input.input) + ")\n" +
        "for item in result.data:\n    print(item.index, len(item.embedding), item.embedding[:4])";
    } else if (openai) {
      openai.textContent =
        "import os\nfrom openai import OpenAI\nclient = OpenAI(base_url=\"" + origin + "/v2/" + model + "/openai/v1\", api_key=os.environ[\"GANTRY_API_KEY\"])\n" +
        "stream = client.chat.completions.create(model=\"" + model + "\", stream=True,\n    messages=" + JSON.stringify(input.messages || []) + ")\n" +
        "for chunk in stream:\n    print(chunk.choices[0].delta.content or \"\", end=\"\")";
    }
  }

  async function run(form) {
    const model = form.dataset.model;
    const isText = form.dataset.kind === "text";
    const input = await formJson(form, true);
    let reply = null;
    if (isText) {
      const box = form.querySelector("[data-chat]");
      const message = box.value.trim();
      if (!message) { showProblem(form, { errors: ["input.message: write a message first"] }, 422); return; }
      history.push({ role: "user", content: message });
      input.messages = history.slice();
      bubble("user", message);
      reply = bubble("assistant", "");
      box.value = "";
    }
    snippets(form, input);
    clearProblem(form);
    document.getElementById("stream").textContent = "";
    document.getElementById("media").textContent = "";
    document.getElementById("output").textContent = "";
    const submit = form.querySelector('button[type="submit"]');
    submit.disabled = true;
    say("Submitting…");
    const res = await call("POST", "/console/api/models/v2/" + encodeURIComponent(model) + "/run", { input });
    if (!res.ok) {
      submit.disabled = false;
      if (isText) { history.pop(); reply.remove(); }
      say("Not submitted.");
      showProblem(form, res.data, res.status);
      return;
    }
    const id = res.data.id;
    current = { model, id };
    const cancel = document.getElementById("cancel");
    cancel.hidden = false;
    cancel.onclick = () => call("POST", "/console/api/models/v2/" + encodeURIComponent(model) + "/cancel/" + encodeURIComponent(id));
    say("Job " + id + " " + res.data.status + "…");
    follow("/console/api/models/v2/" + encodeURIComponent(model) + "/stream/" + encodeURIComponent(id),
      isText ? reply : document.getElementById("stream"),
      (job) => {
        submit.disabled = false;
        cancel.hidden = true;
        current = null;
        finish(job, isText ? reply : null);
      });
  }

  function streamedText(output) {
    if (typeof output === "string") return output;
    if (output && Array.isArray(output.tokens)) return output.tokens.join("");
    if (output && typeof output.text === "string") return output.text;
    return "";
  }

  function follow(url, sink, done) {
    const source = new EventSource(url);
    let ended = false;
    source.addEventListener("chunk", (e) => {
      const data = JSON.parse(e.data);
      const text = streamedText(data.output);
      if (text) sink.textContent += text;
    });
    source.addEventListener("progress", (e) => { say("Running: " + JSON.stringify(JSON.parse(e.data).progress)); });
    source.addEventListener("status", (e) => { ended = true; source.close(); done(JSON.parse(e.data)); });
    source.addEventListener("error", (e) => {
      if (ended) return;
      if (e.data) { ended = true; source.close(); done({ status: "FAILED", error: JSON.parse(e.data).error }); return; }
      if (source.readyState === EventSource.CLOSED) { ended = true; done({ status: "FAILED", error: "the stream closed" }); }
    });
  }

  function finish(job, reply) {
    const cost = job.output && typeof job.output.cost === "number" ? " · cost $" + job.output.cost.toFixed(6) : "";
    const took = job.executionTime ? " · ran " + job.executionTime + " ms" : "";
    say("Job " + job.id + " " + job.status + took + cost + (job.error ? " · " + job.error : ""));
    if (job.output) {
      document.getElementById("output").textContent = JSON.stringify(job.output, null, 2);
      showMedia(document.getElementById("media"), job.output);
      const choice = job.output.choices && job.output.choices[0];
      if (reply && choice && typeof choice.text === "string") {
        reply.textContent = choice.text;
        history.push({ role: "assistant", content: choice.text });
      }
    } else if (reply) {
      history.pop();
      reply.textContent = "(" + job.status.toLowerCase() + ")";
    }
  }

  // ---- the microphone: 16-bit PCM WAV, which every speech model reads ----
  let recording = null;
  async function toggleRecording(button) {
    const input = document.getElementById(button.dataset.record);
    if (recording) {
      const { ctx, stream, chunks, node } = recording;
      recording = null;
      node.disconnect();
      stream.getTracks().forEach((t) => t.stop());
      input.dataset.recorded = wavBase64(chunks, ctx.sampleRate);
      await ctx.close();
      button.textContent = "Recorded: record again";
      return;
    }
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) { button.textContent = "No microphone here"; return; }
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const ctx = new AudioContext();
    const source = ctx.createMediaStreamSource(stream);
    const node = ctx.createScriptProcessor(4096, 1, 1);
    const chunks = [];
    node.onaudioprocess = (e) => chunks.push(new Float32Array(e.inputBuffer.getChannelData(0)));
    source.connect(node); node.connect(ctx.destination);
    recording = { ctx, stream, chunks, node };
    button.textContent = "Stop recording";
  }

  function wavBase64(chunks, rate) {
    const samples = chunks.reduce((n, c) => n + c.length, 0);
    const view = new DataView(new ArrayBuffer(44 + samples * 2));
    const text = (at, s) => { for (let i = 0; i < s.length; i++) view.setUint8(at + i, s.charCodeAt(i)); };
    text(0, "RIFF"); view.setUint32(4, 36 + samples * 2, true); text(8, "WAVEfmt ");
    view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
    view.setUint32(24, rate, true); view.setUint32(28, rate * 2, true); view.setUint16(32, 2, true); view.setUint16(34, 16, true);
    text(36, "data"); view.setUint32(40, samples * 2, true);
    let at = 44;
    for (const chunk of chunks) for (const s of chunk) { view.setInt16(at, Math.max(-1, Math.min(1, s)) * 0x7fff, true); at += 2; }
    let binary = "";
    const bytes = new Uint8Array(view.buffer);
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  }

  // ---- a job's page -----------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    const media = document.getElementById("media");
    if (media && media.dataset.output) showMedia(media, JSON.parse(media.dataset.output));
    const stream = document.querySelector("[data-follow]");
    if (stream) follow(stream.dataset.follow, stream, () => window.location.reload());
    const logs = document.querySelector("[data-logs]");
    if (logs) {
      // A pod's log, line by line as it is written; the stream is read once
      // (no automatic reconnect, which would repeat the tail).
      const source = new EventSource(logs.dataset.logs);
      source.onmessage = (e) => {
        const entry = JSON.parse(e.data);
        logs.textContent += entry.ts.slice(11, 23) + " " + (entry.source === "system" ? "[system] " : "") + entry.line + "\n";
      };
      source.onerror = () => {
        source.close();
        document.getElementById("log-state").textContent = "The log stream ended; reload the page to follow it again.";
      };
    }
  });
})();
