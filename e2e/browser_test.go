package e2e

import (
	"context"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The real tools the status page and dashboard tests drive: Debian's chromium (headless) and
// prometheus, which `./taskw test` installs (tools:apt). Each is found through its variable, else on
// PATH; a missing one fails the test (never skips it), naming how to install it.

func requireTool(t *testing.T, variable, name string) string {
	t.Helper()
	if p := os.Getenv(variable); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run the tests through `./taskw test`, which installs Debian's %s (or set %s)", name, name, variable)
	}
	return p
}

// chromiumFlags run Chromium headless as root on a machine without a network: no sandbox, no GPU, and
// none of its own connections (background networking, component updates, sync), which a closed
// network refuses.
var chromiumFlags = []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
	"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"}

// chromium runs the browser once with args on a fresh profile and returns what it printed on stdout.
func chromium(t *testing.T, args ...string) string {
	t.Helper()
	bin := requireTool(t, "FPMBUS_CHROMIUM_BIN", "chromium")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all := append(append([]string{}, chromiumFlags...), "--user-data-dir="+t.TempDir())
	cmd := exec.CommandContext(ctx, bin, append(all, args...)...)
	cmd.Env = append(testEnv(t), "XDG_RUNTIME_DIR="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// pageDOM is the page's DOM as Chromium has it after its script ran for scriptMillis of virtual time
// (its polls of /status.json included), or, when scriptMillis is 0, the page as a browser without
// scripts shows it: the server's HTML as served. Headless Chromium cannot stand in for that browser:
// it ignores --disable-javascript (the script runs, and only a slow first poll kept the old check from
// seeing it), and with --blink-settings=scriptEnabled=false it prints no DOM and takes no screenshot.
func pageDOM(t *testing.T, url string, scriptMillis int) string {
	t.Helper()
	if scriptMillis == 0 {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %v", url, resp.Status, err)
		}
		return string(body)
	}
	return chromium(t, "--virtual-time-budget="+strconv.Itoa(scriptMillis), "--dump-dom", url)
}

// screenshot saves the page at width×height into the test's artefact directory and checks that it is
// a PNG of that size with something drawn on it. It returns the file.
func screenshot(t *testing.T, url, name string, width, height int) string {
	t.Helper()
	file := filepath.Join(artifactDir(t), name)
	chromium(t, "--virtual-time-budget=4000", "--hide-scrollbars", "--window-size="+strconv.Itoa(width)+","+strconv.Itoa(height), "--screenshot="+file, url)
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot %s: %v", file, err)
	}
	if b := img.Bounds(); b.Dx() != width || b.Dy() != height {
		t.Fatalf("screenshot %s is %v, want %dx%d", file, b, width, height)
	}
	colours := map[uint32]bool{}
	for y := 0; y < height && len(colours) < 16; y += 7 {
		for x := 0; x < width; x += 7 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[r>>12<<8|g>>12<<4|b>>12] = true
		}
	}
	if len(colours) < 4 {
		t.Fatalf("screenshot %s is blank (%d colours)", file, len(colours))
	}
	t.Logf("screenshot: %s", file)
	return file
}

// artifactDir is where a test keeps what a person looks at afterwards (a screenshot):
// $FPMBUS_TEST_ARTIFACTS/<test> (./taskw test sets it to bin/test-artifacts), else
// <tmp>/fpmbus-test-artifacts/<test>. It is emptied first and kept after the test.
func artifactDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv("FPMBUS_TEST_ARTIFACTS")
	if root == "" {
		root = filepath.Join(os.TempDir(), "fpmbus-test-artifacts")
	}
	dir := filepath.Join(root, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
