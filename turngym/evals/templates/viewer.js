"use strict";
// turngym episode viewer: renders the embedded JSON one page of groups at a time.
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const PAGE_GROUPS = 20;
  const OBS_SHOWN = 4000; // characters of an observation shown before "show all"
  const state = { env: "", ds: "", oc: "", cl: "", q: "", wrapper: "", est: D.estimators[0] || "", page: 0 };
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

  function setup() {
    $("title").textContent = D.title;
    const nTurns = D.eps.reduce((s, e) => s + e.t.length, 0);
    $("summary").textContent = `${D.groups.length} groups · ${D.eps.length} episodes · ${nTurns} turns` +
      (D.models.length ? ` · model ${D.models.join(", ")}` : "") +
      (D.wrappers.length ? ` · rewards: ${D.wrappers.join(", ")}` : " · no reward scores loaded") + ` · turngym ${D.turngym}`;
    for (const n of D.notes.concat([D.tokenizer.note])) $("notes").append(el("div", { text: n }));
    fillSelect($("f-env"), uniq("env"), "all");
    fillSelect($("f-ds"), uniq("ds"), "all");
    fillSelect($("f-oc"), ["correct", "incorrect", "partial", "unscored"].filter((o) => D.eps.some((e) => e.oc === o)), "all");
    option($("f-cl"), "", "all");
    option($("f-cl"), "largest", "largest cluster (A)");
    option($("f-cl"), "other", "other clusters");
    option($("f-cl"), "none", "no answer");
    const sw = $("wrapper-switch");
    if (D.wrappers.length) {
      sw.append(el("span", { text: "reward: " }));
      for (const w of [""].concat(D.wrappers)) {
        const input = el("input", { type: "radio", name: "wrapper", value: w });
        if (w === "") input.checked = true;
        input.addEventListener("change", () => { state.wrapper = w; render(); });
        sw.append(el("label", {}, input, " " + (w || "all")));
      }
    }
    if (D.estimators.length) {
      for (const e of D.estimators) option($("f-est"), e, D.partial_estimators.includes(e) ? `${e} (rewards only, see note)` : e);
      option($("f-est"), "", "hide");
      $("f-est").value = state.est;
    } else $("est-label").classList.add("hidden");
    const legend = $("legend");
    if (D.wrappers.length) legend.append(scaleLegend("per-turn reward", D.scale));
    if (D.estimators.length) legend.append(scaleLegend("advantage (dashed chips)", D.adv_scale));
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
    if (state.q && !haystack(i).includes(state.q)) return false;
    return true;
  }
  function applyFilters() {
    visible = [];
    D.groups.forEach((g, gi) => {
      const eps = g.eps.filter(matches);
      if (eps.length) visible.push([gi, eps]);
    });
    render();
  }

  function chipsFor(i, j) {
    const out = [];
    const ws = state.wrapper ? [state.wrapper] : D.wrappers;
    for (const w of ws) {
      const r = D.r[w] && D.r[w][i];
      if (!r) continue;
      const v = r[j], c = colour(v, D.scale);
      out.push(el("span", { class: "chip", "data-wrapper": w, "data-value": String(v), title: `${w} reward on turn ${j + 1}: ${v}`,
        style: `background:${c.bg};color:${c.fg}`, text: `${w} ${fmt(v)}` }));
      const adv = state.est && D.adv[w] && D.adv[w][state.est] && D.adv[w][state.est][i];
      if (adv) {
        const a = adv[j], ca = colour(a, D.adv_scale);
        out.push(el("span", { class: "chip adv", "data-wrapper": w, "data-estimator": state.est, "data-value": String(a),
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
    const head = el("div", { class: "thead" }, el("span", { class: "tno", text: `turn ${j + 1}` }));
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
    if (e.trunc) head.append(el("span", { class: "badge", text: `truncated${e.why ? ": " + e.why : ""}` }));
    for (const w of state.wrapper ? [state.wrapper] : D.wrappers) {
      const r = D.r[w] && D.r[w][i];
      if (r) head.append(el("span", { class: "total", title: `${w}: sum of per-turn rewards`, text: `Σ${w} ${fmt(r.reduce((a, b) => a + b, 0))}` }));
    }
    const tb = el("button", { type: "button", class: "tokbtn", text: "tokens" });
    let tv = null;
    tb.addEventListener("click", () => { if (tv) { tv.remove(); tv = null; } else { tv = tokenView(i); sec.append(tv); } });
    head.append(tb);
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

  function render() {
    const main = $("groups");
    main.replaceChildren();
    const nEps = visible.reduce((s, v) => s + v[1].length, 0);
    const pages = Math.max(1, Math.ceil(visible.length / PAGE_GROUPS));
    state.page = Math.min(state.page, pages - 1);
    $("page").textContent = `page ${state.page + 1} of ${pages}`;
    $("status").textContent = `${visible.length} of ${D.groups.length} groups, ${nEps} of ${D.eps.length} episodes match`;
    if (!visible.length) main.append(el("div", { class: "empty", text: "no episode matches these filters" }));
    for (const [gi, eps] of visible.slice(state.page * PAGE_GROUPS, (state.page + 1) * PAGE_GROUPS)) {
      const g = D.groups[gi];
      const card = el("article", { class: "group", "data-group": g.id },
        el("h2", { text: g.q.length > 600 ? g.q.slice(0, 600) + " … [cut]" : g.q || "(no question)" }),
        el("div", { class: "gmeta", text: `group ${g.id} · ${D.eps[g.eps[0]].env} · ${D.eps[g.eps[0]].ds || "no dataset"}` +
          (g.gold ? ` · gold ${g.gold}` : "") + ` · ${eps.length} of ${g.eps.length} episodes shown` }));
      for (const i of eps) card.append(renderEpisode(i));
      main.append(card);
    }
    renders += 1; // for tests and benchmarks: a render has finished
    document.body.setAttribute("data-renders", String(renders));
    document.body.setAttribute("data-ready", "1");
  }

  setup();
  applyFilters();
})();
