package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fpmbus/fpmbus/internal/fsutil"
	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Paths follow Dynamo's self-benchmark naming (components/src/dynamo/vllm/worker_factory.py:
// _benchmark_rank_path, _benchmark_merged_path), all derived from the configured output path <base>
// split as Python's os.path.splitext splits it into <stem><ext>: rank 0 writes <base>, rank N
// <stem>_dpN<ext>; a worker managing the ranks from dp_start writes its merged artefact to
// <stem>_merged<ext> when dp_start is 0, else <stem>_dp<dp_start>_merged<ext>; the worker-probe sidecar
// is the merged path's <stem>_worker_probe<ext>, <stem>_merged_worker_probe<ext> for a whole run.

// sidecarPathFor returns the worker-probe sidecar path for a merged artefact path:
// /tmp/benchmark_results_merged.json -> /tmp/benchmark_results_merged_worker_probe.json.
func sidecarPathFor(mergedPath string) string {
	stem, ext := splitExt(mergedPath)
	return stem + "_worker_probe" + ext
}

// mergedPathFor returns Dynamo's merged artefact path for the configured output path base (rank 0's
// file) and the first DP rank merged: /tmp/benchmark_results.json with dpStart 0 ->
// /tmp/benchmark_results_merged.json; with dpStart 4 (a node-local merge of ranks 4..7) ->
// /tmp/benchmark_results_dp4_merged.json.
func mergedPathFor(base string, dpStart int) string {
	stem, ext := splitExt(base)
	if dpStart > 0 {
		stem += "_dp" + strconv.Itoa(dpStart)
	}
	return stem + "_merged" + ext
}

// basePathOf returns the configured output path a rank file was named from: <stem>_dpN<ext> ->
// <stem><ext>; a name without the suffix is rank 0's, the base path itself.
func basePathOf(rankPath string) string {
	stem, ext, _ := splitRankPath(rankPath)
	return stem + ext
}

// splitExt splits path as Python's os.path.splitext does: ext is the last '.' of the final element
// and what follows, unless that element is all dots before it (".bench" has no extension, as
// filepath.Ext would have it).
func splitExt(path string) (stem, ext string) {
	name := path[strings.LastIndexByte(path, filepath.Separator)+1:]
	lead := len(name) - len(strings.TrimLeft(name, "."))
	if i := strings.LastIndexByte(name, '.'); i > lead {
		cut := len(path) - len(name) + i
		return path[:cut], path[cut:]
	}
	return path, ""
}

var dpSuffix = regexp.MustCompile(`_dp(\d+)$`)

// rankFromPath returns N for a "<stem>_dpN<ext>" file name, or -1 (rank unknown: the document's dp.rank
// is used). Dynamo names rank 0's file without a suffix, so a name without one is not assumed to be rank 0.
func rankFromPath(path string) int {
	_, _, rank := splitRankPath(path)
	return rank
}

// splitRankPath undoes Dynamo's rank file naming, <stem>_dpN<ext> from the configured path's
// os.path.splitext: it returns that stem and ext and N, or the path's own split and -1 when the name
// has no such suffix. rankFromPath and basePathOf both read names through it, so a file is never given
// a rank by one and the base path of rank 0 by the other (".b_dp1" has no extension: it is rank 1 of
// ".b", not a file named by its extension).
func splitRankPath(path string) (stem, ext string, rank int) {
	stem, ext = splitExt(path)
	if m := dpSuffix.FindStringSubmatch(stem); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return strings.TrimSuffix(stem, m[0]), ext, n
		}
	}
	return stem, ext, -1
}

// RunIDPlaceholder in an output path template is replaced by the run id (percent-encoded as a subject
// token, so it is safe in a file name).
const RunIDPlaceholder = "{run_id}"

// expandPath replaces RunIDPlaceholder in template with runID's token encoding.
func expandPath(template, runID string) string {
	return strings.ReplaceAll(template, RunIDPlaceholder, streams.EncodeToken(runID))
}

// WriteResult writes a merge's files so that a sidecar never sits next to another run's merged artefact:
// a sidecar left by an earlier run is removed first, then the merged artefact is written atomically, then
// (only when the merged artefact has an engine block) the sidecar, atomically. It returns the merged
// artefact's sha256 and size.
func WriteResult(res *result) (digest string, size int64, err error) {
	if err := removeIfExists(res.SidecarPath); err != nil {
		return "", 0, fmt.Errorf("merge: remove stale sidecar: %w", err)
	}
	digest, size, err = writeAtomic(res.MergedPath, func(w io.Writer) error { return schemas.WriteBenchJSON(w, res.Merged) })
	if err != nil {
		return "", 0, fmt.Errorf("merge: write merged artefact: %w", err)
	}
	if res.Sidecar != nil {
		if err := writeSidecar(res.SidecarPath, res.Sidecar); err != nil {
			return digest, size, err
		}
	}
	return digest, size, nil
}

// writeSidecar writes a sidecar atomically.
func writeSidecar(path string, sidecar *schemas.BenchNode) error {
	if _, _, err := writeAtomic(path, func(w io.Writer) error { return schemas.WriteBenchJSON(w, sidecar) }); err != nil {
		return fmt.Errorf("merge: write worker-probe sidecar: %w", err)
	}
	return nil
}

// writeAtomic writes path atomically (fsutil.WriteAtomic: temporary file, fsync, rename, directory
// fsync; a crash leaves either the old file or the new one) and returns the sha256 (hex) and size of
// what was written, which the merged message and the outcome event carry.
func writeAtomic(path string, write func(io.Writer) error) (string, int64, error) {
	h := sha256.New()
	var size int64
	err := fsutil.WriteAtomic(path, 0o644, func(w io.Writer) error {
		cw := &countWriter{w: io.MultiWriter(w, h)}
		err := write(cw)
		size = cw.n
		return err
	})
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), size, nil
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

// removeIfExists removes the regular file path, if there is one; anything else there is refused.
func removeIfExists(path string) error {
	exists, err := fsutil.CheckRegular(path)
	if err != nil || !exists {
		return err
	}
	if err := fsutil.RemoveRegular(path); err != nil {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(path))
}

// WriteSummary writes what an offline merge wrote (`fpmbus bench merge`): the merged artefact, its size
// and digest (WriteResult's), the time the merge took, and the worker-probe sidecar.
func (res *result) WriteSummary(w io.Writer, digest string, size int64, took time.Duration) {
	fmt.Fprintf(w, "merged run %s: ranks %v of %d, %d points -> %s (%d bytes, sha256 %s) in %v\n",
		res.RunID, res.SourceRanks, res.GlobalSize, res.Points, res.MergedPath, size, digest, took.Round(time.Millisecond))
	if res.Sidecar != nil {
		resolution, _ := res.Sidecar.Path("merged", "resolution").Text()
		fmt.Fprintf(w, "worker-probe sidecar -> %s (merged resolution %s)\n", res.SidecarPath, resolution)
	} else {
		fmt.Fprintln(w, "no engine block: no worker-probe sidecar")
	}
}
