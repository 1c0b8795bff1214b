#!/usr/bin/env bash
# Builds llama.cpp's llama-server and a small random-weight model into
# .cache/llamacpp, for the real-engine suite (package realengine) and for
# trying kvrouter in front of a real engine by hand.
#
# Everything comes from package registries, pinned:
#   - npm node-llama-cpp@3.21.1: llama.cpp release v0.4.0's source as a git
#     bundle (llama/gitRelease.bundle);
#   - npm @node-llama-cpp/linux-x64@3.21.1: that release's prebuilt CPU
#     libraries (ggml, its CPU backends, llama, llama-common);
#   - Debian's g++ and python3-numpy.
# Only tools/server and tools/mtmd (which the server links) are compiled,
# against the prebuilt libraries. The model is written by the release's own
# gguf-py (scripts/llamacpp-model.py): llama architecture, 2 layers, hidden
# 128, F16, random weights, the tokenizer of the release's vocab-only
# models/ggml-vocab-phi-3.gguf. No weights are downloaded.
#
# Skips everything when .cache/llamacpp/pin matches this pin. JOBS (default:
# 2) compiles in parallel, at nice level NICE (default: 10). Objects are
# kept in .cache/llamacpp-build until the build succeeds, so a rerun after
# a failure compiles only what is missing. Output:
#   .cache/llamacpp/bin/llama-server  (with its shared libraries beside it)
#   .cache/llamacpp/model.gguf
set -euo pipefail
cd "$(dirname "$0")/.."

nlc_version=3.21.1
release=v0.4.0
out=.cache/llamacpp
pin="node-llama-cpp@$nlc_version llama.cpp@$release model:$(sha256sum scripts/llamacpp-model.py | cut -c1-16)"

if [ -f "$out/pin" ] && [ "$(cat "$out/pin")" = "$pin" ] && [ -x "$out/bin/llama-server" ] && [ -f "$out/model.gguf" ]; then
  echo "== $out is up to date ($pin)"
  exit 0
fi

need_apt=()
command -v g++ >/dev/null || need_apt+=(g++)
command -v git >/dev/null || need_apt+=(git)
command -v npm >/dev/null || need_apt+=(npm)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need_apt+=(python3-numpy)
/usr/bin/python3 -c 'import yaml' 2>/dev/null || need_apt+=(python3-yaml)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

start=$(date +%s)
work=.cache/llamacpp-build
mkdir -p "$work"
work=$(cd "$work" && pwd)
echo "== npm pack node-llama-cpp@$nlc_version @node-llama-cpp/linux-x64@$nlc_version"
(cd "$work" && npm pack --silent "node-llama-cpp@$nlc_version" "@node-llama-cpp/linux-x64@$nlc_version" >/dev/null)
rm -rf "$work/nlc" "$work/bins" "$work/src"
mkdir -p "$work/nlc" "$work/bins"
tar xzf "$work/node-llama-cpp-$nlc_version.tgz" -C "$work/nlc"
tar xzf "$work/node-llama-cpp-linux-x64-$nlc_version.tgz" -C "$work/bins"
got=$(sed -n 's/.*"release": *"\([^"]*\)".*/\1/p' "$work/nlc/package/llama/binariesGithubRelease.json")
if [ "$got" != "$release" ]; then
  echo "llamacpp.sh: node-llama-cpp@$nlc_version ships llama.cpp $got, want $release" >&2
  exit 1
fi
src=$work/src
git -c advice.detachedHead=false clone -q "$work/nlc/package/llama/gitRelease.bundle" "$src"
libs=$work/bins/package/bins/linux-x64

# Compile: the server at -O2, mtmd and the vendored helpers it needs (only
# linked, never used with a text model) at -O0 to save time.
obj=$work/obj
mkdir -p "$obj"
inc=(-I"$src/include" -I"$src/ggml/include" -I"$src/common" -I"$src/vendor" -I"$src/vendor/hash" -I"$src/tools/mtmd" -I"$src/tools/server" -I"$obj" -I"$src")
defs=(-DNDEBUG -DLLAMA_SHARED -DGGML_SHARED -DLLAMA_SUBPROCESS
  -DCPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH=1048576 -DCPPHTTPLIB_LISTEN_BACKLOG=512
  -DCPPHTTPLIB_REQUEST_URI_MAX_LENGTH=32768 -DCPPHTTPLIB_TCP_NODELAY=1)

# The web UI is left out: llama-ui-embed without an asset directory writes
# an empty asset table.
g++ -O1 -std=c++17 -o "$obj/llama-ui-embed" "$src/tools/ui/embed.cpp"
"$obj/llama-ui-embed" "$obj/ui.cpp" "$obj/ui.h"

units=()
for f in "$src"/tools/server/*.cpp "$src/vendor/cpp-httplib/httplib.cpp" "$obj/ui.cpp"; do
  units+=("-O2 $f")
done
for f in "$src"/tools/mtmd/*.cpp "$src"/tools/mtmd/models/*.cpp "$src/vendor/hash/hash.cpp"; do
  case "$(basename "$f")" in mtmd-cli.cpp|deprecation-warning.cpp) continue ;; esac
  units+=("-O0 $f")
done
# As the release's vendor/hash/CMakeLists.txt: sha1.c as C++, the others C.
for f in "$src/vendor/hash/xxhash/xxhash.c" "$src/vendor/hash/sha256/sha256.c"; do
  units+=("-O0 -xc -std=gnu11 $f")
done
units+=("-O0 -xc++ $src/vendor/hash/sha1/sha1.c")
echo "== compile ${#units[@]} files (JOBS=${JOBS:-2}, nice ${NICE:-10})"
export obj src
export inc_s="${inc[*]}" defs_s="${defs[*]}"
# An object is named for its source's path in the release and written
# whole or not at all; one present is not compiled again.
printf '%s\n' "${units[@]}" | nice -n "${NICE:-10}" xargs -P "${JOBS:-2}" -I{} bash -c '
  set -euo pipefail
  read -ra a <<<"{}"
  src_file=${a[-1]}
  rel=${src_file#"$src"/}
  o=$obj/${rel//\//_}.o
  [ -f "$o" ] && exit 0
  g++ -c -std=c++17 -fPIC -w ${a[*]:0:${#a[@]}-1} $inc_s $defs_s -o "$o.tmp" "$src_file"
  mv "$o.tmp" "$o"
'

mkdir -p "$out/bin"
cp "$libs"/libggml-base.so "$libs"/libggml.v0.4.0.so "$libs"/libggml-cpu-*.so "$libs"/libllama.v0.4.0.so "$libs"/libllama-common.so "$out/bin/"
echo "== link llama-server"
nice -n "${NICE:-10}" g++ -o "$out/bin/llama-server" "$obj"/*.o -L"$out/bin" -l:libllama-common.so -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so \
  -Wl,-rpath,'$ORIGIN' -pthread
"$out/bin/llama-server" --version 2>&1 | tail -2

echo "== model: scripts/llamacpp-model.py"
/usr/bin/python3 scripts/llamacpp-model.py --gguf-py "$src/gguf-py" --vocab "$src/models/ggml-vocab-phi-3.gguf" --out "$out/model.gguf"

echo "$pin" >"$out/pin"
rm -rf "$work"
echo "== $out built in $(($(date +%s) - start)) s"
