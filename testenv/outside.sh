#!/usr/bin/env bash
# Builds and runs examples/quickstart from a module outside this
# repository, exactly as the README's "Install" section says to use warden
# today (a go.mod with require and replace lines), and checks that the
# README's example is that program, character for character.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The README's Go block under "## Example" is examples/quickstart/main.go.
readme_example=$(awk '/^## Example/{e=1; next} e && /^```go$/{c=1; next} c && /^```$/{exit} c' "$root/README.md")
if [ "$readme_example" != "$(cat "$root/examples/quickstart/main.go")" ]; then
  echo "outside.sh: the README's example differs from examples/quickstart/main.go; paste the file into the README" >&2
  diff <(printf '%s\n' "$readme_example") "$root/examples/quickstart/main.go" >&2 || true
  exit 1
fi

# The Go version the README states is the go directive of every module (the
# Go version of the dependencies' own go.mod files sets it: modernc.org/sqlite
# and go-redis need 1.26) and the one test.sh asks for.
readme_go=$(sed -n 's/^warden needs Go \([0-9][0-9.]*\) or newer.*/\1/p' "$root/README.md")
[ -n "$readme_go" ] || { echo "outside.sh: the README does not say which Go it needs ('warden needs Go X or newer')" >&2; exit 1; }
for mod in $(cd "$root" && find . -name go.mod -not -path '*/node_modules/*' -not -path './testenv/.run/*' | sort); do
  v=$(awk '$1 == "go" {print $2; exit}' "$root/$mod")
  if [ "$(echo "$v" | cut -d. -f1,2)" != "$readme_go" ]; then
    echo "outside.sh: $mod says go $v; the README says Go $readme_go" >&2; exit 1
  fi
done
grep -q "Go $readme_go or newer is required" "$root/testenv/test.sh" ||
  { echo "outside.sh: testenv/test.sh does not ask for Go $readme_go" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$root/examples/quickstart/main.go" "$dir/"
cd "$dir"
# The lines the README gives.
cat >go.mod <<MOD
module example.com/app

go $readme_go

require (
	github.com/warden-go/warden v0.0.0
	github.com/warden-go/warden/store/sqlite v0.0.0
)

replace (
	github.com/warden-go/warden => $root
	github.com/warden-go/warden/store/sqlite => $root/store/sqlite
)
MOD
GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || GOFLAGS=-mod=mod go mod tidy
want=$'report written under the lock, fencing token > 0: true\nreceipt r-42 for 4200 cents'
for run in 1 2; do # the second run gets the stored receipt
  got=$(GOWORK=off go run .)
  if [ "$got" != "$want" ]; then
    echo "outside.sh: run $run printed:"; echo "$got"; echo "want:"; echo "$want"; exit 1
  fi
done
echo "outside module: examples/quickstart built and ran twice as the README says"
