package main

import (
	"context"
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/consumers/trace"
	"github.com/fpmbus/fpmbus/internal/upstack"
	"github.com/fpmbus/fpmbus/producer"
)

// discardHelp is where help output goes between tests.
var discardHelp io.Writer = os.Stderr

// referenceDoc is the command reference the README links to: every command, flag and variable is
// documented there (the README itself keeps the overview).
const referenceDoc = "../../docs/reference.md"

// documentedCommands are the command paths the reference documents, each under a heading
// "### fpmbus <path>". Every registered command must be among them.
var documentedCommands = []string{
	"up", "bridge", "publish", "trace", "trace backfill", "trace info", "trace verify", "trace replay", "gaps", "gaps report", "merge", "bench merge", "bench validate", "bench publish",
	"seal", "datasets publish", "datasets coverage", "datasets ls", "datasets get", "datasets history", "datasets predict",
	"predict-service",
	"streams show", "streams apply", "version",
}

// sharedFlagSections are README sections documenting flags common to several commands, by anchor.
var sharedFlagSections = map[string]string{
	"connection-flags": "### Connection flags",
	"stream-flags":     "### Stream flags",
}

// TestREADMEDocumentsEveryCommandAndFlag keeps the README honest: every command has a section and
// every flag of it appears there as `--name`.
func TestREADMEDocumentsEveryCommandAndFlag(t *testing.T) {
	raw, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	helpOutput = io.Discard
	t.Cleanup(func() { helpOutput = discardHelp })
	for name := range commands {
		found := false
		for _, p := range documentedCommands {
			found = found || p == name || strings.HasPrefix(p, name+" ")
		}
		if !found {
			t.Errorf("command %q is registered but not in documentedCommands (and so not checked against the README)", name)
		}
	}
	for _, path := range documentedCommands {
		t.Run(path, func(t *testing.T) {
			if code := runMain(context.Background(), append(strings.Fields(path), "-h"), io.Discard, io.Discard); code != 0 {
				t.Fatalf("fpmbus %s -h exited %d", path, code)
			}
			fs, ok := flagSets[path]
			if !ok {
				t.Fatalf("fpmbus %s made no FlagSet named %q", path, path)
			}
			section := readmeSection(readme, "### fpmbus "+path)
			if section == "" {
				t.Fatalf("README has no section \"### fpmbus %s\"", path)
			}
			documented := func(text, name string) bool {
				return strings.Contains(text, "`--"+name+"`") || strings.Contains(text, "`--"+name+" ")
			}
			fs.VisitAll(func(f *flag.Flag) {
				if documented(section, f.Name) {
					return
				}
				// Flags shared by several commands are documented once, in a section the command links to.
				for anchor, heading := range sharedFlagSections {
					if strings.Contains(section, "(#"+anchor+")") && documented(readmeSection(readme, heading), f.Name) {
						return
					}
				}
				{
					t.Errorf("README section for fpmbus %s does not document `--%s`", path, f.Name)
				}
			})
		})
	}
}

// readmeSection returns the text from heading to the next heading of the same or a higher level.
func readmeSection(readme, heading string) string {
	i := strings.Index(readme, heading+"\n")
	if i < 0 {
		return ""
	}
	rest := readme[i+len(heading)+1:]
	if m := regexp.MustCompile(`(?m)^#{1,3} `).FindStringIndex(rest); m != nil {
		rest = rest[:m[0]]
	}
	return rest
}

// readmeBlock returns the text between the markers <!-- name --> and <!-- /name --> (the opening
// marker may carry a note after the name).
func readmeBlock(t *testing.T, readme, name string) string {
	t.Helper()
	open := regexp.MustCompile(`<!-- ` + regexp.QuoteMeta(name) + `(:[^>]*)? -->\n`)
	m := open.FindStringIndex(readme)
	end := strings.Index(readme, "<!-- /"+name+" -->")
	if m == nil || end < m[1] {
		t.Fatalf("README has no block <!-- %s --> … <!-- /%s -->", name, name)
	}
	return readme[m[1]:end]
}

// The README's `fpmbus up` order table is the order the code runs: both come from upStages.
func TestREADMEUpOrderIsTheRunGroupsOrder(t *testing.T) {
	raw, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readmeBlock(t, string(raw), "up-order"), upstack.OrderTable(); got != want {
		t.Fatalf("README's up-order block differs from upStages; it should read:\n%s\ngot:\n%s", want, got)
	}
	var names []string
	r := &upstack.Run{Trace: &trace.Config{}, Demo: &producer.Config{}}
	for _, c := range r.Components() {
		names = append(names, c.Name)
	}
	for i, s := range upstack.Stages {
		if i >= len(names) || names[i] != s.Name {
			t.Fatalf("components() with every stage enabled gives %q, not the order of upStages", names)
		}
	}
}

// The README's Environment table is the list of variables fpmbus reads.
func TestREADMEEnvironmentIsTheParsersList(t *testing.T) {
	raw, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readmeBlock(t, string(raw), "environment"), environment.Table(); got != want {
		t.Fatalf("README's environment block differs from environment (env.go); it should read:\n%s\ngot:\n%s", want, got)
	}
}
