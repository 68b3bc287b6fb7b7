// The golden ids transformers.js could not give (tests/data/tokenizers/golden: the null entries,
// texts whose whitespace its JavaScript regexes read differently), from Hugging Face's own Rust
// tokenizers through their Node bindings (npm `tokenizers` 0.23.2, the version of the Python
// package on the GPU machine, which gives the same ids there). Also checks that the Rust library
// agrees with every non-null golden. Writes a fills file for oracle.py --fill.
//
//   cd <scratch> && npm i tokenizers@0.23.2
//   NODE_PATH=<scratch>/node_modules node benchmarks/tokenizers/oracle_rust_node.js \
//       .fixtures/tokenizers tests/data/tokenizers fills.json
//   python3 benchmarks/tokenizers/oracle.py .fixtures/tokenizers tests/data/tokenizers --fill fills.json
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(require.resolve('tokenizers', { paths: [process.env.NODE_PATH || process.cwd()] }));

const [fixtures, dataDir, fillsPath] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(path.join(dataDir, 'corpus.json'), 'utf8'));
const version = require(require.resolve('tokenizers/package.json', { paths: [process.env.NODE_PATH || process.cwd()] })).version;

(async () => {
  const fills = {};
  let disagree = 0;
  for (const name of ['gpt2', 'llama2', 'llama3', 'qwen2_5']) {
    const golden = `${name}_tokenizer_json.json`;
    const g = JSON.parse(fs.readFileSync(path.join(dataDir, 'golden', golden), 'utf8'));
    const tok = Tokenizer.fromFile(path.join(fixtures, name, 'tokenizer.json'));
    let agree = 0, total = 0;
    for (let i = 0; i < corpus.length; ++i) {
      const ids = (await tok.encode(corpus[i], null, { addSpecialTokens: false })).getIds();
      if (g.encode[i] === null) {
        fills[golden] = fills[golden] || { _oracle: `tokenizers ${version} (npm: the Rust library's Node bindings)`, encode: {} };
        fills[golden].encode[i] = ids;
      } else {
        ++total;
        if (JSON.stringify(ids) === JSON.stringify(g.encode[i])) ++agree;
        else ++disagree, console.log(`  ${golden} encode[${i}] differs`);
      }
    }
    console.log(`${golden}: the Rust tokenizers ${version} agree with ${agree} of ${total} goldens`);
  }
  fs.writeFileSync(fillsPath, JSON.stringify(fills) + '\n');
  console.log(`wrote ${fillsPath}`);
  process.exit(disagree ? 1 : 0);
})();
