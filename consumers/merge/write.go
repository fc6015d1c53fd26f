package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Paths follow Dynamo's naming: rank 0 writes <output>, rank N <stem>_dpN<ext>, the merged artefact is
// <stem>_merged<ext>, and its sidecar <merged stem>_worker_probe<ext>.

// SidecarPathFor returns the worker-probe sidecar path for a merged artefact path:
// /tmp/benchmark_results_merged.json -> /tmp/benchmark_results_merged_worker_probe.json.
func SidecarPathFor(mergedPath string) string {
	ext := filepath.Ext(mergedPath)
	return strings.TrimSuffix(mergedPath, ext) + "_worker_probe" + ext
}

// MergedPathFor returns Dynamo's merged path for the rank-0 artefact path:
// /tmp/benchmark_results.json -> /tmp/benchmark_results_merged.json.
func MergedPathFor(rank0Path string) string {
	ext := filepath.Ext(rank0Path)
	stem := strings.TrimSuffix(rank0Path, ext)
	if m := dpSuffix.FindStringSubmatch(stem); m != nil {
		stem = strings.TrimSuffix(stem, m[0])
	}
	return stem + "_merged" + ext
}

var dpSuffix = regexp.MustCompile(`_dp(\d+)$`)

// RankFromPath returns N for a "<stem>_dpN<ext>" file name, or -1 (rank unknown: the document's dp.rank
// is used). Dynamo names rank 0's file without a suffix, so a name without one is not assumed to be rank 0.
func RankFromPath(path string) int {
	stem := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	if m := dpSuffix.FindStringSubmatch(stem); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return n
		}
	}
	return -1
}

// RunIDPlaceholder in an output path template is replaced by the run id (percent-encoded as a subject
// token, so it is safe in a file name).
const RunIDPlaceholder = "{run_id}"

// ExpandPath replaces RunIDPlaceholder in template with runID's token encoding.
func ExpandPath(template, runID string) string {
	return strings.ReplaceAll(template, RunIDPlaceholder, streams.EncodeToken(runID))
}

// WriteResult writes a merge's files in the order the seed fixes: a sidecar left by an earlier run is
// removed first, then the merged artefact is written atomically, then (when the merged artefact has an
// engine block) the sidecar, atomically. It returns the merged artefact's sha256 and size.
func WriteResult(res *Result) (digest string, size int64, err error) {
	if err := removeIfExists(res.SidecarPath); err != nil {
		return "", 0, fmt.Errorf("merge: remove stale sidecar: %w", err)
	}
	digest, size, err = WriteFileAtomic(res.MergedPath, func(w io.Writer) error { return schemas.WriteBenchJSON(w, res.Merged) })
	if err != nil {
		return "", 0, fmt.Errorf("merge: write merged artefact: %w", err)
	}
	if res.Sidecar != nil {
		if err := WriteSidecar(res.SidecarPath, res.Sidecar); err != nil {
			return digest, size, err
		}
	}
	return digest, size, nil
}

// WriteSidecar writes a sidecar atomically.
func WriteSidecar(path string, sidecar *schemas.BenchNode) error {
	if _, _, err := WriteFileAtomic(path, func(w io.Writer) error { return schemas.WriteBenchJSON(w, sidecar) }); err != nil {
		return fmt.Errorf("merge: write worker-probe sidecar: %w", err)
	}
	return nil
}

// WriteFileAtomic writes path through a temporary file in the same directory: write, fsync, close,
// rename over path, fsync the directory. A crash leaves either the old file or the new one, never a torn
// one; a leftover "<path>.tmp-*" file is garbage from an interrupted write. It returns the sha256 (hex)
// and size of what was written.
func WriteFileAtomic(path string, write func(io.Writer) error) (string, int64, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return "", 0, err
	}
	tmp := f.Name()
	cleanup := func() { f.Close(); os.Remove(tmp) }
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	if err := write(cw); err != nil {
		cleanup()
		return "", 0, err
	}
	if err := f.Sync(); err != nil {
		cleanup()
		return "", 0, err
	}
	if err := f.Chmod(0o644); err != nil {
		cleanup()
		return "", 0, err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	if err := syncDir(dir); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return err
	}
	return nil
}

func removeIfExists(path string) error {
	err := os.Remove(path)
	if err == nil {
		return syncDir(filepath.Dir(path))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// SHA256Hex is the hex sha256 of b.
func SHA256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
