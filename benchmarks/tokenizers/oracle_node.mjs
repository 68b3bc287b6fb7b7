// Golden ids for forge's tokenizer tests (tests/data/test_tokenizer_files.cpp), from reference
// implementations published on npm:
//   Hugging Face tokenizer.json  @xenova/transformers 2.17.2 (PreTrainedTokenizer built from the
//                                file alone, no tokenizer_config.json: the file's pipeline)
//   tiktoken ranks               tiktoken 1.0.22 (OpenAI's Rust tiktoken compiled to WASM)
// and, as a second opinion where one exists, llama3-tokenizer-js 1.2.0 (LLaMA-3).
// The sentencepiece .model goldens come from Debian's python3-sentencepiece (oracle_spm.py).
//
//   cd <a scratch dir> && npm i --ignore-scripts @xenova/transformers@2.17.2 tiktoken@1.0.22 \
//       llama3-tokenizer-js@1.2.0
//   NODE_PATH=<scratch>/node_modules node benchmarks/tokenizers/oracle_node.mjs \
//       <fixtures dir (scripts/fetch-tokenizer-fixtures.sh)> tests/data/tokenizers
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(path.join(process.env.NODE_PATH || process.cwd(), 'x.js'));
const [fixtures, outDir] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(path.join(outDir, 'corpus.json'), 'utf8'));

// (the package's index also loads its image code, which needs a native module: take the tokenizers only)
const { PreTrainedTokenizer } = await import(path.join(path.dirname(require.resolve('@xenova/transformers/package.json')), 'src', 'tokenizers.js'));
const tiktoken = require('tiktoken');

function write(name, oracle, encode, ordinary) {
  const out = { tokenizer: name, oracle, corpus: 'corpus.json', encode };
  if (ordinary) out.encode_ordinary = ordinary;
  const file = path.join(outDir, 'golden', name.replace(/[\/.]/g, '_') + '.json');
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(out) + '\n');
  console.log(`${file}: ${encode.length} texts`);
}

for (const name of ['gpt2', 'llama2', 'llama3', 'qwen2_5']) {
  const json = JSON.parse(fs.readFileSync(path.join(fixtures, name, 'tokenizer.json'), 'utf8'));
  const tok = new PreTrainedTokenizer(json, {});
  // JavaScript's \s also matches U+FEFF, which the Rust references (Oniguruma in tokenizers,
  // the regex crate in tiktoken) do not: texts with it are left out (null) for this oracle.
  const ids = corpus.map((t) => (t.includes('\ufeff') ? null : tok.encode(t, null, { add_special_tokens: false })));
  write(name + '/tokenizer.json', '@xenova/transformers@2.17.2', ids);
  if (name === 'llama3') {
    const { default: llama3 } = await import(require.resolve('llama3-tokenizer-js'));
    const other = corpus.map((t) => llama3.encode(t, { bos: false, eos: false }));
    const differ = other.filter((v, i) => ids[i] && JSON.stringify(v) !== JSON.stringify(ids[i])).length;
    console.log(`llama3: llama3-tokenizer-js@1.2.0 differs from transformers.js on ${differ} of ${ids.length} texts`);
  }
}

for (const name of ['cl100k_base', 'o200k_base']) {
  const enc = tiktoken.get_encoding(name);
  const ids = corpus.map((t) => Array.from(enc.encode(t, 'all')));
  const ordinary = corpus.map((t) => Array.from(enc.encode_ordinary(t)));
  write(name + '.tiktoken', 'tiktoken@1.0.22', ids, ordinary);
  enc.free();
}
