"use strict";
// turngym episode viewer: renders the embedded JSON one page of groups at a time.
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const PAGE_GROUPS = 20;
  const OBS_SHOWN = 4000; // characters of an observation shown before "show all"
  const state = { env: "", ds: "", oc: "", cl: "", q: "", reward: "", est: D.estimators[0] || "", page: 0,
    sort: "", dmin: 0, qk: -1, view: "groups", target: null };
  const SIDE = D.runs.length === 2; // a second run to compare item by item
  let haystacks = null; // lower-cased searchable text per episode, built on the first search
  let visible = []; // [groupIndex, [episodeIndex...]] after filtering
  let renders = 0;

  const $ = (id) => document.getElementById(id);
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k === "style") e.style.cssText = v;
      else e.setAttribute(k, v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
    return e;
  }
  function fmt(v) {
    if (typeof v !== "number") return String(v);
    if (v === 0 || Math.abs(v) >= 0.001) return v.toFixed(3);
    return v.toExponential(2);
  }
  // one diverging scale: blue (negative) - white (0) - red (positive), symmetric around 0
  const NEG = [33, 102, 172], POS = [178, 24, 43];
  function colour(v, lim) {
    const t = Math.max(-1, Math.min(1, v / (lim || 1)));
    const end = t < 0 ? NEG : POS, a = Math.abs(t);
    const rgb = end.map((c) => Math.round(255 + (c - 255) * a));
    return { bg: `rgb(${rgb.join(",")})`, fg: a > 0.55 ? "#fff" : "#111" };
  }
  const wscale = (w) => (D.wscale && D.wscale[w]) || D.scale;
  const ascale = (w, e) => (D.ascale && D.ascale[w] && D.ascale[w][e]) || D.adv_scale;
  function norm(w, v) { return Math.max(-1, Math.min(1, v / wscale(w))); }
  function scaleLegend(label, lim) {
    const bar = el("span", { class: "bar", style: `background: linear-gradient(to right, rgb(${NEG}), #fff, rgb(${POS}))` });
    return el("span", { class: "scale" }, el("b", { text: label }), el("span", { text: fmt(-lim) }), bar, el("span", { text: "+" + fmt(lim) }));
  }
  // whitespace made visible: newline ↵ (the line still breaks), tab ⇥, space ·
  function visibleWs(text) { return text.replace(/ /g, "·").replace(/\t/g, "⇥").replace(/\r?\n/g, (m) => "↵" + m); }
  function wsSummary(text) {
    const counts = [["newline", (text.match(/\n/g) || []).length], ["space", (text.match(/ /g) || []).length],
      ["tab", (text.match(/\t/g) || []).length]];
    const other = text.length - counts.reduce((s, c) => s + c[1], 0);
    if (other) counts.push(["other whitespace character", other]);
    return counts.filter((c) => c[1]).map(([n, k]) => `${k} ${n}${k === 1 ? "" : "s"}`).join(", ");
  }
  function option(sel, value, label) { sel.append(el("option", { value: value, text: label })); }
  function fillSelect(sel, values, allLabel) {
    option(sel, "", allLabel);
    for (const v of values) option(sel, v, v || "(none)");
  }
  function uniq(key) { return [...new Set(D.eps.map((e) => e[key]))].sort(); }

  // per episode: how far its rewards disagree on one turn (normalised rewards, 0..2), and how far the
  // rewards (or the chosen one) disagree with the turn's truth label (0..1)
  const hasTruth = D.eps.some((e) => e.t.some((t) => t.gt === 0 || t.gt === 1));
  function truthGap(w, v, gt) { const n = norm(w, v); return gt ? (1 - n) / 2 : (1 + n) / 2; }
  const dis = D.eps.map((e, i) => {
    let best = 0;
    for (let j = 0; j < e.t.length; j++) {
      let lo = Infinity, hi = -Infinity;
      for (const w of D.rewards) {
        const r = D.r[w][i];
        if (!r || typeof r[j] !== "number") continue;
        const n = norm(w, r[j]);
        if (n < lo) lo = n;
        if (n > hi) hi = n;
      }
      if (hi - lo > best) best = hi - lo;
    }
    return best;
  });
  function truthDis(i) {
    const e = D.eps[i];
    let best = -1;
    for (const w of state.reward ? [state.reward] : D.rewards) {
      const r = D.r[w][i];
      if (!r) continue;
      e.t.forEach((t, j) => { if ((t.gt === 0 || t.gt === 1) && typeof r[j] === "number") best = Math.max(best, truthGap(w, r[j], t.gt)); });
    }
    return best;
  }
  const qkCount = D.queries.map(() => 0);
  for (const e of D.eps) qkCount[e.qk] += 1;
  function link(i, j) { return "#ep=" + encodeURIComponent(D.eps[i].id) + (j === undefined ? "" : "&t=" + j); }
  function mfmt(m) {
    if (!m || typeof m.value !== "number") return "–";
    const ci = m.ci95 && m.ci95.every((x) => typeof x === "number") ? ` [${m.ci95.map((x) => x.toFixed(3)).join(", ")}]` : "";
    return `${m.value.toFixed(3)}${ci} (n=${m.n})`;
  }
  function runMetrics() {
    const box = $("metrics");
    D.run_metrics.forEach((m, r) => {
      const parts = Object.entries(m.metrics || {}).filter(([, v]) => v && typeof v.value === "number").map(([k, v]) => `${k} ${mfmt(v)}`);
      parts.push(`turns/episode ${m.turns_per_episode.toFixed(2)}`);
      for (const [w, s] of Object.entries(m.rewards || {})) parts.push(`mean ${w} turn reward ${fmt(s.mean)}`);
      const row = el("div", { class: "run-metrics", "data-run": String(r) }, el("b", { text: `${D.runs[r]}: ` }), `${m.episodes} episodes · ` + parts.join(" · "));
      box.append(row);
      if (m.steps && m.steps.length) {
        const t = el("table", { class: "steps", "data-run": String(r) }, el("tr", {}, el("th", { text: "training step" }), el("th", { text: "episodes" }),
          el("th", { text: "outcome" }), el("th", { text: "mean turn reward" })));
        for (const s of m.steps) t.append(el("tr", { "data-step": String(s.step) }, el("td", { text: String(s.step) }), el("td", { text: String(s.episodes) }),
          el("td", { text: s.outcome === null ? "–" : fmt(s.outcome) }), el("td", { text: s.turn_reward === null ? "–" : fmt(s.turn_reward) })));
        box.append(t);
      }
    });
  }
  function truthPanel() {
    if (!hasTruth || !D.rewards.length) return;
    const box = el("details", { id: "truth-panel" }, el("summary", { text: "where each reward most disagrees with the per-turn truth (top 10 turns)" }));
    for (const w of D.rewards) {
      const rows = [];
      D.eps.forEach((e, i) => {
        const r = D.r[w][i];
        if (r) e.t.forEach((t, j) => { if ((t.gt === 0 || t.gt === 1) && typeof r[j] === "number") rows.push([truthGap(w, r[j], t.gt), i, j, r[j], t.gt]); });
      });
      rows.sort((a, b) => b[0] - a[0] || a[1] - b[1] || a[2] - b[2]);
      const ol = el("ol", { class: "truth-list", "data-reward": w });
      for (const [gap, i, j, v, gt] of rows.slice(0, 10)) {
        ol.append(el("li", { "data-ep": D.eps[i].id, "data-turn": String(j) }, el("a", { href: link(i, j), text: `${D.eps[i].oid} turn ${j + 1}` }),
          ` ${w} ${fmt(v)} but truth ${gt ? "✓" : "✗"} (gap ${gap.toFixed(2)})`));
      }
      box.append(el("div", {}, el("b", { text: `${w}: ` }), rows.length ? ol : "no scored turn has a truth label"));
    }
    $("metrics").append(box);
  }

  function setup() {
    $("title").textContent = D.title;
    const nTurns = D.eps.reduce((s, e) => s + e.t.length, 0);
    $("summary").textContent = `${D.groups.length} groups · ${D.eps.length} episodes · ${nTurns} turns` +
      (D.models.length ? ` · model ${D.models.join(", ")}` : "") +
      (D.rewards.length ? ` · rewards: ${D.rewards.join(", ")}` : " · no reward scores loaded") + ` · turngym ${D.turngym}`;
    for (const n of D.notes.concat([D.tokenizer.note])) $("notes").append(el("div", { text: n }));
    fillSelect($("f-env"), uniq("env"), "all");
    fillSelect($("f-ds"), uniq("ds"), "all");
    fillSelect($("f-oc"), ["correct", "incorrect", "partial", "unscored"].filter((o) => D.eps.some((e) => e.oc === o)), "all");
    option($("f-cl"), "", "all");
    option($("f-cl"), "largest", "largest cluster (A)");
    option($("f-cl"), "other", "other clusters");
    option($("f-cl"), "none", "no answer");
    const sw = $("reward-switch");
    if (D.rewards.length) {
      sw.append(el("span", { text: "reward: " }));
      for (const w of [""].concat(D.rewards)) {
        const input = el("input", { type: "radio", name: "reward", value: w });
        if (w === "") input.checked = true;
        input.addEventListener("change", () => { state.reward = w; render(); });
        sw.append(el("label", {}, input, " " + (w || "all")));
      }
    }
    if (D.estimators.length) {
      for (const e of D.estimators) option($("f-est"), e, D.partial_estimators.includes(e) ? `${e} (rewards only, see note)` : e);
      option($("f-est"), "", "hide");
      $("f-est").value = state.est;
    } else $("est-label").classList.add("hidden");
    const legend = $("legend");
    for (const w of D.rewards) legend.append(scaleLegend(`${w} reward (its own scale)`, wscale(w)));
    if (D.estimators.length) legend.append(el("span", { text: "advantages (dashed chips): each reward and estimator on its own scale, raw value on hover" }));
    option($("f-sort"), "", "file order");
    if (D.rewards.length > 1) option($("f-sort"), "dis", "rewards disagree most");
    if (D.rewards.length && hasTruth) option($("f-sort"), "truth", "disagree most with truth");
    if (D.eps.some((e) => e.step !== null && e.step !== undefined)) option($("f-sort"), "step", "training step");
    if (SIDE) option($("f-sort"), "runs", "runs differ most");
    if (D.rewards.length < 2) $("dmin-label").classList.add("hidden");
    if (SIDE) {
      option($("f-view"), "groups", "groups");
      option($("f-view"), "side", `side by side: ${D.runs[0]} | ${D.runs[1]}`);
    } else $("view-label").classList.add("hidden");
    $("f-sort").addEventListener("change", () => { state.sort = $("f-sort").value; state.page = 0; applyFilters(); });
    $("f-view").addEventListener("change", () => { state.view = $("f-view").value; state.page = 0; applyFilters(); });
    $("f-dmin").addEventListener("change", () => { state.dmin = Number($("f-dmin").value) || 0; state.page = 0; applyFilters(); });
    $("f-qk-clear").addEventListener("click", () => follow(-1));
    runMetrics();
    truthPanel();
    legend.append(el("span", { text: "ground truth per turn: ✓ the env says the turn helped, ✗ it did not, – none recorded" }));
    for (const [id, key] of [["f-env", "env"], ["f-ds", "ds"], ["f-oc", "oc"], ["f-cl", "cl"], ["f-est", "est"]]) {
      $(id).addEventListener("change", () => { state[key] = $(id).value; if (key !== "est") state.page = 0; if (key === "est") render(); else applyFilters(); });
    }
    let timer = null;
    $("f-q").addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { state.q = $("f-q").value.trim().toLowerCase(); state.page = 0; applyFilters(); }, 150);
    });
    $("prev").addEventListener("click", () => { if (state.page > 0) { state.page--; render(); } });
    $("next").addEventListener("click", () => { if ((state.page + 1) * PAGE_GROUPS < visible.length) { state.page++; render(); } });
  }

  function haystack(i) {
    if (!haystacks) {
      haystacks = D.eps.map((e, k) => {
        const g = D.groups[groupOf[k]];
        return [e.id, g ? g.q : "", e.ans || "", ...e.t.map((t) => (t.a || "") + "\n" + (t.o || ""))].join("\n").toLowerCase();
      });
    }
    return haystacks[i];
  }
  const groupOf = new Array(D.eps.length);
  D.groups.forEach((g, gi) => g.eps.forEach((i) => { groupOf[i] = gi; }));

  function matches(i) {
    const e = D.eps[i];
    if (state.env && e.env !== state.env) return false;
    if (state.ds && e.ds !== state.ds) return false;
    if (state.oc && e.oc !== state.oc) return false;
    if (state.cl && e.clk !== state.cl) return false;
    if (state.dmin && dis[i] < state.dmin) return false;
    if (state.qk >= 0 && e.qk !== state.qk) return false;
    if (state.q && !haystack(i).includes(state.q)) return false;
    return true;
  }
  function outcomeMean(eps) {
    const v = eps.map((i) => D.eps[i].out).map((o) => ["correct", "em", "bfcl_valid"].map((k) => o[k]).find((x) => typeof x === "number" || typeof x === "boolean"))
      .filter((x) => x !== undefined).map(Number);
    return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
  }
  function sortKey(eps) {
    if (state.sort === "dis") return -Math.max(...eps.map((i) => dis[i]));
    if (state.sort === "truth") return -Math.max(...eps.map(truthDis));
    if (state.sort === "step") return Math.min(...eps.map((i) => (D.eps[i].step === null || D.eps[i].step === undefined ? Infinity : D.eps[i].step)));
    return 0;
  }
  function applyFilters(quiet) {
    visible = [];
    if (state.view === "side") {  // one unit per item (query), the two runs' matching episodes side by side
      const byQ = new Map();
      D.eps.forEach((e, i) => { if (matches(i)) { if (!byQ.has(e.qk)) byQ.set(e.qk, [[], []]); byQ.get(e.qk)[e.run].push(i); } });
      for (const [qk, pair] of byQ) visible.push([qk, pair[0].concat(pair[1]), pair]);
    } else {
      D.groups.forEach((g, gi) => {
        const eps = g.eps.filter(matches);
        if (eps.length) visible.push([gi, eps]);
      });
    }
    if (state.sort === "runs") {
      const gap = (v) => { const p = v[2] || [v[1].filter((i) => D.eps[i].run === 0), v[1].filter((i) => D.eps[i].run === 1)];
        const a = outcomeMean(p[0]), b = outcomeMean(p[1]); return a === null || b === null ? -1 : Math.abs(a - b); };
      visible = visible.map((v, n) => [gap(v), n, v]).sort((x, y) => y[0] - x[0] || x[1] - y[1]).map((x) => x[2]);
    } else if (state.sort) {
      visible = visible.map((v, n) => [sortKey(v[1]), n, v]).sort((x, y) => x[0] - y[0] || x[1] - y[1]).map((x) => x[2]);
    }
    if (!quiet) render();
  }
  function follow(qk) {
    state.qk = qk;
    state.page = 0;
    if (qk >= 0 && D.eps.some((e) => e.step !== null && e.step !== undefined)) { state.sort = "step"; $("f-sort").value = "step"; }
    $("f-qk").classList.toggle("hidden", qk < 0);
    $("f-qk-text").textContent = qk >= 0 ? `following one item: ${D.queries[qk]}` : "";
    applyFilters();
  }

  function chipsFor(i, j) {
    const out = [];
    const ws = state.reward ? [state.reward] : D.rewards;
    for (const w of ws) {
      const r = D.r[w] && D.r[w][i];
      if (!r) continue;
      const v = r[j], c = colour(v, wscale(w));
      out.push(el("span", { class: "chip", "data-reward": w, "data-value": String(v), title: `${w} reward on turn ${j + 1}: ${v} (colour: ${w}'s own scale ±${fmt(wscale(w))})`,
        style: `background:${c.bg};color:${c.fg}`, text: `${w} ${fmt(v)}` }));
      const adv = state.est && D.adv[w] && D.adv[w][state.est] && D.adv[w][state.est][i];
      if (adv) {
        const a = adv[j], ca = colour(a, ascale(w, state.est));
        out.push(el("span", { class: "chip adv", "data-reward": w, "data-estimator": state.est, "data-value": String(a),
          title: `${state.est} advantage of ${w} on turn ${j + 1}: ${a}`, style: `background:${ca.bg};color:${ca.fg}`, text: `A ${fmt(a)}` }));
      }
    }
    return out;
  }

  function observation(t) {
    if (t.o === null || t.o === undefined) return null;
    const long = t.o.length > OBS_SHOWN;
    const pre = el("pre", { class: "obs", text: long ? t.o.slice(0, OBS_SHOWN) : t.o });
    const label = `observation (${t.o.length} chars${t.ot ? ", truncated by the env" : ""}${long ? `, first ${OBS_SHOWN} shown` : ""})`;
    const summary = el("summary", {}, label);
    const d = el("details", { class: "observation" }, summary, pre);
    if (t.ot) summary.append(" ", el("span", { class: "cut", text: "✂ env cut this output" }));
    if (long) {
      const more = el("button", { type: "button", text: `show all ${t.o.length} characters` });
      more.addEventListener("click", () => { pre.textContent = t.o; more.remove(); });
      d.append(el("div", { class: "cut", text: `… ${t.o.length - OBS_SHOWN} more characters not shown ` }, more));
    }
    return d;
  }

  function renderTurn(i, t, j) {
    const head = el("div", { class: "thead" }, el("a", { class: "tno", href: link(i, j), title: "link to this turn", text: `turn ${j + 1}` }));
    const gt = t.gt === null || t.gt === undefined ? "–" : t.gt ? "✓" : "✗";
    const keys = Object.entries(t.gk || {}).map(([k, v]) => `${k}=${JSON.stringify(v[0])} (${v[1]})`).join(", ");
    head.append(el("span", { class: "gt", title: keys ? `per-turn truth: ${keys}` : "no per-turn truth on this turn", text: `truth ${gt}` }));
    for (const c of chipsFor(i, j)) head.append(c);
    const li = el("li", { class: "turn", "data-turn": String(j) }, head);
    const blank = typeof t.a === "string" && t.a.trim() === "";
    if (blank) {
      li.append(el("div", { class: "wsnote", text: t.a.length ? `whitespace-only action (${wsSummary(t.a)}), shown as ↵ newline · space ⇥ tab` : "empty action" }));
      li.append(el("pre", { class: "action ws", title: "whitespace made visible", text: visibleWs(t.a) }));
    } else li.append(el("pre", { class: "action", text: t.a }));
    if (t.tc && t.tc.length) li.append(el("pre", { class: "calls", text: t.tc.map((c) => JSON.stringify(c)).join("\n") }));
    if (t.pe) li.append(el("div", { class: "perr", text: `parse error: ${t.pe}` }));
    const ms = Object.entries(t.m || {});
    if (ms.length) li.append(el("div", { class: "metrics", text: ms.map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join("  ") }));
    const o = observation(t);
    if (o) li.append(o);
    return li;
  }

  function tokenView(i) {
    const e = D.eps[i], box = el("div", { class: "tokens" });
    const decoded = D.tokenizer.status === "decoded";
    box.append(el("div", { text: D.tokenizer.note + (decoded ? ". Whitespace: ↵ newline, · space, ⇥ tab. Styles: " : ". Styles: ") }, el("span", { class: "tok tok-prompt", text: "prompt" }), " ",
      el("span", { class: "tok tok-action", text: "action (trained)" }), " ", el("span", { class: "tok tok-obs", text: "observation (masked)" })));
    const add = (ids, cls) => {
      for (const id of ids || []) {
        const raw = decoded ? D.vocab[String(id)] : undefined;
        const text = raw === undefined ? (decoded ? `[${id}]` : `${id} `) : visibleWs(raw);
        box.append(el("span", { class: "tok " + cls, title: raw === undefined ? `id ${id}` : `id ${id}: ${JSON.stringify(raw)}`, text: text }));
      }
    };
    if (e.pi >= 0) add(D.prompt_ids[e.pi], "tok-prompt");
    for (const t of e.t) { add(t.fi, "tok-prompt"); add(t.ai, "tok-action"); add(t.oi, "tok-obs"); }  // a forced prefill is prompt
    if (e.pi < 0 && !e.t.some((t) => t.ai)) box.append(el("div", { text: "this episode has no token ids" }));
    return box;
  }

  function renderEpisode(i) {
    const e = D.eps[i];
    const sec = el("section", { class: "episode", "data-id": e.id });
    const head = el("div", { class: "ehead" }, el("span", { class: "eid", text: e.id }),
      el("span", { class: `badge oc-${e.oc}`, title: JSON.stringify(e.out), text: e.oc }),
      el("span", { text: `${e.t.length} turn${e.t.length === 1 ? "" : "s"}` }));
    if (e.cl) head.append(el("span", { class: "badge", title: "answer cluster within the group (A: largest)", text: `cluster ${e.cl}` }));
    if (SIDE) head.append(el("span", { class: "badge run", text: D.runs[e.run] }));
    if (e.step !== null && e.step !== undefined) head.append(el("span", { class: "badge step", text: `step ${e.step}` }));
    if (D.rewards.length > 1) head.append(el("span", { class: "badge dis", title: "largest gap between the normalised rewards of the rewards scored, on one turn (0: agree, 2: opposite ends)", text: `disagreement ${dis[i].toFixed(2)}` }));
    if (e.trunc) head.append(el("span", { class: "badge", text: `truncated${e.why ? ": " + e.why : ""}` }));
    for (const w of state.reward ? [state.reward] : D.rewards) {
      const r = D.r[w] && D.r[w][i];
      if (r) head.append(el("span", { class: "total", title: `${w}: sum of per-turn rewards`, text: `Σ${w} ${fmt(r.reduce((a, b) => a + b, 0))}` }));
    }
    const tb = el("button", { type: "button", class: "tokbtn", text: "tokens" });
    let tv = null;
    tb.addEventListener("click", () => { if (tv) { tv.remove(); tv = null; } else { tv = tokenView(i); sec.append(tv); } });
    head.append(tb);
    if (state.qk < 0 && qkCount[e.qk] > D.groups[groupOf[i]].eps.length) {
      const fb = el("button", { type: "button", class: "followbtn", text: e.step !== null && e.step !== undefined ? "follow this item across steps" : "this item in every group" });
      fb.addEventListener("click", () => follow(e.qk));
      head.append(fb);
    }
    sec.append(head);
    const prompt = D.prompts[e.p] || [];
    if (prompt.length) {
      const d = el("details", { class: "prompt" }, el("summary", {}, `prompt (${prompt.length} message${prompt.length === 1 ? "" : "s"})`));
      for (const m of prompt) d.append(el("pre", { text: `[${m.role}] ${m.content}` }));
      sec.append(d);
    }
    const ol = el("ol", { class: "turns" });
    e.t.forEach((t, j) => ol.append(renderTurn(i, t, j)));
    sec.append(ol);
    sec.append(el("div", { class: "final" }, el("b", { text: "final answer: " }), e.ans === null || e.ans === undefined ? "(none)" : String(e.ans),
      el("span", { class: "metrics", text: "  outcome " + JSON.stringify(e.out) })));
    return sec;
  }

  function heading(q) { return el("h2", { text: q.length > 600 ? q.slice(0, 600) + " … [cut]" : q || "(no question)" }); }
  function groupCard([gi, eps]) {
    const g = D.groups[gi];
    const card = el("article", { class: "group", "data-group": g.id }, heading(g.q),
      el("div", { class: "gmeta", text: `group ${g.id} · ${D.eps[g.eps[0]].env} · ${D.eps[g.eps[0]].ds || "no dataset"}` +
        (g.gold ? ` · gold ${g.gold}` : "") + ` · ${eps.length} of ${g.eps.length} episodes shown` }));
    if ((state.reward ? [state.reward] : D.rewards).some((w) => eps.some((i) => D.r[w][i]))) {
      // built when opened: a page of open grids made every filter re-render ~1.5x slower at 10,000 episodes
      const d = el("details", { class: "gridbox" }, el("summary", { text: "grid: episodes × turns per reward" }));
      d.addEventListener("toggle", () => { if (d.open && !d.querySelector(".ggrid")) d.append(groupGrid(eps)); });
      card.append(d);
    }
    for (const i of eps) card.append(renderEpisode(i));
    return card;
  }
  // episodes x turns, one small table per reward shown, each on its own colour scale; a cell links to its turn.
  // Built as one HTML string (escaped): a group can hold hundreds of cells.
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" };
  function esc(x) { return String(x).replace(/[&<>"]/g, (c) => ESC[c]); }
  function groupGrid(eps) {
    const ws = (state.reward ? [state.reward] : D.rewards).filter((w) => eps.some((i) => D.r[w][i]));
    if (!ws.length) return null;
    const width = Math.max(...eps.map((i) => D.eps[i].t.length));
    let h = "", head = "<tr><th></th>";
    for (let j = 0; j < width; j++) head += `<th>${j + 1}</th>`;
    head += "</tr>";
    for (const w of ws) {
      const lim = wscale(w);
      h += `<table class="grid" data-reward="${esc(w)}"><caption>${esc(w)} (±${fmt(lim)})</caption>${head}`;
      for (const i of eps) {
        const e = D.eps[i], r = D.r[w][i], k = e.oid.lastIndexOf("#");
        h += `<tr><th title="${esc(e.oid)}">${esc(k >= 0 ? e.oid.slice(k) : e.oid)}</th>`;
        for (let j = 0; j < width; j++) {
          if (!r || j >= r.length) { h += '<td class="nil"></td>'; continue; }
          const c = colour(r[j], lim);
          h += `<td><a href="${esc(link(i, j))}" class="cell" data-ep="${esc(e.id)}" data-turn="${j}" data-value="${esc(r[j])}" ` +
            `title="${esc(`${e.oid} turn ${j + 1}: ${w} ${r[j]}`)}" style="background:${c.bg};color:${c.fg}">${esc(fmt(r[j]))}</a></td>`;
        }
        h += "</tr>";
      }
      h += "</table>";
    }
    const box = el("div", { class: "ggrid" });
    box.innerHTML = h;
    return box;
  }
  function sideCard([qk, , pair]) {
    const first = pair[0][0] !== undefined ? pair[0][0] : pair[1][0];
    const g = D.groups[groupOf[first]];
    const card = el("article", { class: "group side", "data-query": String(qk) }, heading(g.q));
    const means = pair.map(outcomeMean);
    card.append(el("div", { class: "gmeta", text: `${D.eps[first].env} · ${D.eps[first].ds || "no dataset"}` + (g.gold ? ` · gold ${g.gold}` : "") +
      " · outcome " + means.map((m, r) => `${D.runs[r]} ${m === null ? "–" : fmt(m)}`).join(" vs ") }));
    const cols = el("div", { class: "cols" });
    pair.forEach((eps, r) => {
      const col = el("div", { class: "col", "data-run": String(r) }, el("h3", { text: `${D.runs[r]} (${eps.length} episode${eps.length === 1 ? "" : "s"})` }));
      if (!eps.length) col.append(el("div", { class: "empty", text: "no episode of this item matches in this run" }));
      for (const i of eps) col.append(renderEpisode(i));
      cols.append(col);
    });
    card.append(cols);
    return card;
  }
  function goToHash() {
    const m = /^#ep=([^&]*)(?:&t=(\d+))?$/.exec(location.hash);
    if (!m) return;
    const id = decodeURIComponent(m[1]), i = D.eps.findIndex((e) => e.id === id);
    if (i < 0) { $("status").textContent = `no episode ${id} in this file`; return; }
    if (!matches(i)) {  // the link wins over the filters that hide its episode
      Object.assign(state, { env: "", ds: "", oc: "", cl: "", q: "", dmin: 0, qk: -1 });
      for (const id2 of ["f-env", "f-ds", "f-oc", "f-cl", "f-q", "f-dmin"]) $(id2).value = id2 === "f-dmin" ? "0" : "";
      $("f-qk").classList.add("hidden");
    }
    state.view = state.view === "side" ? "side" : "groups";
    applyFilters(true);
    const pos = visible.findIndex((v) => v[1].includes(i));
    state.page = Math.floor(pos / PAGE_GROUPS);
    state.target = [id, m[2] === undefined ? null : Number(m[2])];
    render();
  }

  function render() {
    const main = $("groups");
    main.replaceChildren();
    const nEps = visible.reduce((s, v) => s + v[1].length, 0);
    const pages = Math.max(1, Math.ceil(visible.length / PAGE_GROUPS));
    state.page = Math.min(state.page, pages - 1);
    $("page").textContent = `page ${state.page + 1} of ${pages}`;
    $("status").textContent = `${visible.length} of ${D.groups.length} groups, ${nEps} of ${D.eps.length} episodes match`;
    if (!visible.length) main.append(el("div", { class: "empty", text: "no episode matches these filters" }));
    for (const v of visible.slice(state.page * PAGE_GROUPS, (state.page + 1) * PAGE_GROUPS)) main.append(state.view === "side" ? sideCard(v) : groupCard(v));
    if (state.target) {
      const [id, j] = state.target;
      state.target = null;
      const sec = [...main.querySelectorAll("section.episode")].find((s) => s.dataset.id === id);
      if (sec) {
        const li = j === null ? null : sec.querySelector(`li.turn[data-turn='${j}']`);
        (li || sec).classList.add("target");
        (li || sec).scrollIntoView({ block: "center" });
      }
    }
    renders += 1; // for tests and benchmarks: a render has finished
    document.body.setAttribute("data-renders", String(renders));
    document.body.setAttribute("data-ready", "1");
  }

  setup();
  applyFilters();
  window.addEventListener("hashchange", goToHash);
  goToHash();
})();
