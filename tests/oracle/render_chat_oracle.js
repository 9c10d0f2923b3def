#!/usr/bin/env node
// Reference renderer for perry's chat-template tests: renders each {template, context, now} case with
// @huggingface/jinja (`new Template(src).render(ctx)`) and prints a JSON array of results,
// {"ok": true, "output": "..."} or {"ok": false, "error": "..."}.
// Usage: node render_chat_oracle.js cases.json
// `now` ([year, month 1-12, day, hour, minute], local time) pins what strftime_now() sees.
"use strict";
const fs = require("fs");
let Template;
try {
  ({ Template } = require("@huggingface/jinja"));
} catch (e) {
  process.stderr.write("cannot load @huggingface/jinja (run scripts/install-deps.sh): " + e.message + "\n");
  process.exit(2);
}
const RealDate = Date;
function pinDate(now) {
  const fixed = new RealDate(now[0], now[1] - 1, now[2], now[3] || 0, now[4] || 0).getTime();
  globalThis.Date = class extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(fixed);
      else super(...args);
    }
    static now() {
      return fixed;
    }
  };
}
const cases = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const results = cases.map((c) => {
  globalThis.Date = RealDate;
  if (c.now) pinDate(c.now);
  try {
    return { ok: true, output: new Template(c.template).render(c.context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message ? e.message : e) };
  }
});
globalThis.Date = RealDate;
process.stdout.write(JSON.stringify(results));
