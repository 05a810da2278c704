#!/usr/bin/env bash
# Runs every curl example of the README against a real capsnet-serve on the bundled model and prints
# each command with its output as Markdown (long arrays shortened). The README's examples come from it:
#   bash docs/api-examples.sh                  # print
#   bash docs/api-examples.sh --update-readme  # rewrite the README between the api-examples markers
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
export CAPSNET_DATA_DIR=${CAPSNET_DATA_DIR:-../shared/data/mnist}
BIN=$(realpath "${BIN:-.venv/bin}")
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT

# The first MNIST test image (a 7) as seven.png, from the official files.
"$BIN/python" - "$WORK/seven.png" <<'PY'
import sys
from training.data.mnist import load_split, to_float
from service.imaging import array_to_png
split = load_split(None, "test")
open(sys.argv[1], "wb").write(array_to_png(to_float(split.images[:1])[0, 0]))
PY

"$BIN/python" -m service.main --port "$PORT" --grpc-port 0 >"$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 120); do curl -sf "localhost:$PORT/health/ready" >/dev/null && break; sleep 0.5; done
kill -0 $SERVER 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }

shorten() {  # keep the first values of long arrays so outputs stay readable
  "$BIN/python" -c '
import json, sys
def cut(x, depth=0):
    if isinstance(x, list):
        if len(x) <= 10:  # the ten class scores stay whole
            return [cut(v, depth + 1) for v in x]
        return [cut(v, depth + 1) for v in x[:4]] + ["…"]
    if isinstance(x, dict):
        if "format_version" in x and "files" in x:  # a whole model card: its headline fields
            x = {k: x[k] for k in ("name", "architecture", "routing", "parameters", "input", "metrics")} | {"…": "…"}
        return {k: cut(v, depth) for k, v in x.items()}
    return x
text = sys.stdin.read()
try:
    data = json.loads(text)
except ValueError:
    sys.stdout.write(text)  # not JSON (metrics, a status code): as received
else:
    short = cut(data)
    # What needs no shortening is shown byte for byte as the server sent it; the rest in the same compact form.
    out = text if short == data else json.dumps(short, ensure_ascii=False, separators=(",", ":"))
    print(out.rstrip("\n"))
'
}
run() {
  printf '```sh\n%s\n```\n```\n' "$(echo "$*" | sed "s|localhost:$PORT|localhost:8000|g")"
  (cd "$WORK" && eval "$@") | shorten | sed "s|localhost:$PORT|localhost:8000|g"
  printf '```\n\n'
}
H="localhost:$PORT"
OUTPUT=$WORK/examples.md
exec 3>&1
exec >"$OUTPUT"
MODEL=$(curl -s "$H/v1/models" | "$BIN/python" -c 'import json,sys; print(json.load(sys.stdin)["default_model"])')
OTHERS=$(curl -s "$H/v1/models" | "$BIN/python" -c '
import json, sys
listing = json.load(sys.stdin)
print(" ".join(m["name"] for m in listing["models"] if m["name"] != listing["default_model"]))')

run curl -s "$H/v1/models"
run curl -s "$H/v1/models/$MODEL"
run curl -s -F files=@seven.png "'$H/v1/classify?top_k=3'"
for OTHER in $OTHERS; do  # every other bundled model (the int8 one), by name
  run curl -s -F files=@seven.png "'$H/v1/models/$OTHER/classify?top_k=3'"
done
run curl -s -F files=@seven.png "$H/v1/capsules"
NO_DECODER=$(curl -s "$H/v1/models" | "$BIN/python" -c '
import json, sys
print(" ".join(m["name"] for m in json.load(sys.stdin)["models"] if not m["has_decoder"]))')
for OTHER in $NO_DECODER; do  # a model without a decoder (EM routing): 4x4 poses, and no reconstruction
  run curl -s -F files=@seven.png "$H/v1/models/$OTHER/capsules"
  run curl -s -F files=@seven.png "'$H/v1/models/$OTHER/reconstruct?class=7'"
done
run curl -s -F files=@seven.png "'$H/v1/reconstruct?class=7'"
run curl -s -F files=@seven.png "'$H/v1/perturb?low=-0.1&high=0.1&step=0.1'"
POSES=$(cd "$WORK" && curl -s -F files=@seven.png "$H/v1/capsules" | "$BIN/python" -c 'import json,sys; print(json.dumps({"poses": json.load(sys.stdin)["capsules"][0]["poses"], "class": 7}))')
echo "$POSES" >"$WORK/poses.json"
run curl -s -H "'content-type: application/json'" -d @poses.json "$H/v1/decode"
run curl -s -F files=@seven.png "$H/v1/explain"
"$BIN/python" - "$WORK/blank.png" <<'PY'
import sys
from PIL import Image
Image.new("L", (64, 64), 255).save(sys.argv[1])
PY
run curl -s -F files=@seven.png -F files=@blank.png "'$H/v1/classify?top_k=1'"
run curl -s -F files=@seven.png -F files=@blank.png "'$H/v1/classify?reject_ood=true'"
run curl -s "$H/v2"
run curl -s -o /dev/null -w "'%{http_code}\n'" "$H/v2/health/live"
run curl -s -o /dev/null -w "'%{http_code}\n'" "$H/v2/health/ready"
run curl -s -o /dev/null -w "'%{http_code}\n'" "$H/v2/models/$MODEL/ready"
run curl -s "$H/v2/models/$MODEL"
"$BIN/python" - "$WORK/seven.png" "$WORK/infer.json" <<'PY'
import io, json, sys
import numpy as np
from PIL import Image
pixels = np.asarray(Image.open(sys.argv[1]), dtype=np.float32) / 255.0
body = {"id": "42", "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": pixels.ravel().tolist()}],
        "outputs": [{"name": "lengths"}]}
json.dump(body, open(sys.argv[2], "w"))
PY
run curl -s -H "'content-type: application/json'" -d @infer.json "$H/v2/models/$MODEL/infer"
run curl -s "$H/health/live"
run curl -s "$H/health/ready"
run "curl -s $H/metrics | grep -E '^capsnet_(batch_size_count|models_loaded|execution_provider_info)'"
printf 'hello' >"$WORK/notes.txt"
run curl -s -F files=@notes.txt "$H/v1/classify"

exec 1>&3
if [ "${1:-}" = "--update-readme" ]; then
  "$BIN/python" - README.md "$OUTPUT" <<'PY'
import re, sys
readme, examples = open(sys.argv[1]).read(), open(sys.argv[2]).read()
start, end = "<!-- api-examples:start -->", "<!-- api-examples:end -->"
if start not in readme or end not in readme:
    sys.exit("README.md has no api-examples markers")
head, rest = readme.split(start, 1)
open(sys.argv[1], "w").write(head + start + "\n" + examples + rest[rest.index(end):])
PY
  echo "README.md updated"
else
  cat "$OUTPUT"
fi
