#!/usr/bin/env node
// Oracle for perry's tokenizer tests: runs the Hugging Face `tokenizers` library (npm package,
// installed in tests/oracle/node_modules by scripts/install-deps.sh) on a tokenizer.json.
//
//   node tokenize_oracle.js <tokenizer.json> <input.json> <output.json>
//
// input.json:  {"texts": ["...", ...], "id_lists": [[1, 2, ...], ...]}
// output.json: {"encodings": [{"ids": [...], "ids_no_special": [...],
//                              "decoded": "...", "decoded_skip_special": "...",
//                              "roundtrip": "..."}, ...],
//               "decodings": [{"decoded": "...", "decoded_skip_special": "..."}, ...]}
// "decoded*" of an encoding decode its `ids` (with special tokens); "roundtrip" decodes
// `ids_no_special` keeping special tokens, i.e. HF's decode(encode(text)).
'use strict';
const fs = require('fs');

let Tokenizer;
try {
  ({ Tokenizer } = require('tokenizers'));
} catch (e) {
  console.error('tokenize_oracle: cannot load the npm package "tokenizers" (' + e.message +
                '); run scripts/install-deps.sh');
  process.exit(3);
}

async function main() {
  const [tokPath, inPath, outPath] = process.argv.slice(2);
  if (!outPath) {
    console.error('usage: node tokenize_oracle.js <tokenizer.json> <input.json> <output.json>');
    process.exit(2);
  }
  const tok = Tokenizer.fromFile(tokPath);
  const input = JSON.parse(fs.readFileSync(inPath, 'utf8'));
  const encodings = [];
  for (const text of input.texts || []) {
    const withSpecial = await tok.encode(text, null, { addSpecialTokens: true });
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = withSpecial.getIds();
    encodings.push({
      ids: ids,
      ids_no_special: plain.getIds(),
      decoded: await tok.decode(ids, false),
      decoded_skip_special: await tok.decode(ids, true),
      roundtrip: await tok.decode(plain.getIds(), false),
    });
  }
  const decodings = [];
  for (const ids of input.id_lists || []) {
    decodings.push({
      decoded: await tok.decode(ids, false),
      decoded_skip_special: await tok.decode(ids, true),
    });
  }
  fs.writeFileSync(outPath, JSON.stringify({ encodings, decodings }));
}

main().catch((e) => {
  console.error('tokenize_oracle: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
