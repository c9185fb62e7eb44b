#!/usr/bin/env bash
# Headless Chromium for the browser tests (Debian packages; Playwright drives it).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium" >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "setup: chromium not found; browser tests will be skipped (install Debian's chromium)" >&2
fi
