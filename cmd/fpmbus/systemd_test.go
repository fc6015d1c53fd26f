package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The systemd units in ops/systemd are checked as deployed: each fpmbus unit's ExecStart, with the
// variables of fpmbus.env.example and the unit's own Environment= expanded as systemd expands them, is
// run through fpmbus's own flag parser for that command; every variable they set is one fpmbus reads
// (or a FPMBUS_*_FLAGS word list a unit expands) and holds a value fpmbus accepts; and every unit is
// hardened: a dedicated user or DynamicUser, ProtectSystem=strict, NoNewPrivileges, PrivateTmp, and its
// StateDirectory as the only writable place.

const systemdDir = "../../ops/systemd"

// unitFile is a parsed systemd unit: the values of each key of [Service], in order.
type unitFile map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	var cont string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cont != "" {
			line, cont = cont+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		case section == "Service":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: line %q is not key=value", path, line)
			}
			u[strings.TrimSpace(k)] = append(u[strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u unitFile) last(key string) string {
	if v := u[key]; len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}

// readEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile= does (comments and blank lines
// skipped, one pair of surrounding quotes removed).
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", path, line)
		}
		env[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
	}
	return env
}

var unitVar = regexp.MustCompile(`^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$`)

// execArgs expands an ExecStart command line as systemd does: %i is the instance, "$NAME" alone as a
// word becomes its value split at whitespace, "${NAME}" its value as one word. It returns the words
// and the variables it expanded.
func execArgs(t *testing.T, line, instance string, env map[string]string) ([]string, []string) {
	t.Helper()
	line = strings.ReplaceAll(strings.ReplaceAll(line, "%%", "\x00"), "%i", instance)
	line = strings.ReplaceAll(line, "\x00", "%")
	var words, used []string
	for _, w := range strings.Fields(line) {
		m := unitVar.FindStringSubmatch(w)
		if m == nil {
			if strings.Contains(w, "$") {
				t.Fatalf("ExecStart word %q: a variable inside a word is not expanded by systemd", w)
			}
			words = append(words, strings.Trim(w, `"`))
			continue
		}
		v, ok := env[m[1]]
		if !ok {
			t.Fatalf("ExecStart uses $%s, which neither the unit nor fpmbus.env.example sets", m[1])
		}
		used = append(used, m[1])
		if strings.HasPrefix(w, "${") {
			words = append(words, v)
		} else {
			words = append(words, strings.Fields(v)...)
		}
	}
	return words, used
}

func TestSystemdUnitsRunFlagsThatExistAndAreHardened(t *testing.T) {
	units, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	if err != nil || len(units) == 0 {
		t.Fatalf("no units in %s: %v", systemdDir, err)
	}
	example := readEnvFile(t, filepath.Join(systemdDir, "fpmbus.env.example"))
	expandedFlags := map[string]bool{} // FPMBUS_*_FLAGS some unit expands
	commandsWithUnits := map[string]bool{}
	for _, path := range units {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, path)
			for key, want := range map[string]string{"ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes", "ProtectHome": "yes"} {
				if got := u.last(key); got != want {
					t.Errorf("%s=%q, want %q", key, got, want)
				}
			}
			if user := u.last("User"); u.last("DynamicUser") != "yes" && (user == "" || user == "root" || user == "0") {
				t.Errorf("runs as %q: want a dedicated user or DynamicUser=yes", user)
			}
			if u.last("StateDirectory") == "" {
				t.Error("no StateDirectory: the one place it may write")
			}
			for _, key := range []string{"ReadWritePaths", "ReadWriteDirectories"} {
				if len(u[key]) > 0 {
					t.Errorf("%s=%v: only the StateDirectory is writable", key, u[key])
				}
			}
			if !strings.HasPrefix(name, "fpmbus-") {
				return
			}
			// The environment systemd gives the command: the unit's Environment=, then the env file.
			env := map[string]string{}
			for _, e := range u["Environment"] {
				k, v, ok := strings.Cut(strings.Trim(e, `"`), "=")
				if !ok {
					t.Fatalf("Environment=%s is not NAME=VALUE", e)
				}
				env[k] = v
			}
			for k, v := range example {
				env[k] = v
			}
			if files := strings.Join(u["EnvironmentFile"], " "); !strings.Contains(files, "/etc/fpmbus/fpmbus.env") {
				t.Errorf("EnvironmentFile=%s: want /etc/fpmbus/fpmbus.env (the example's installed name)", files)
			}
			words, used := execArgs(t, u.last("ExecStart"), "a", env)
			for _, v := range used {
				expandedFlags[v] = true
			}
			if len(words) < 2 || words[0] != "/usr/local/bin/fpmbus" {
				t.Fatalf("ExecStart %q does not run /usr/local/bin/fpmbus <command>", words)
			}
			args := words[1:]
			if _, ok := commands[args[0]]; !ok {
				t.Fatalf("ExecStart runs fpmbus %s, which is no command", args[0])
			}
			commandsWithUnits[args[0]] = true
			// Every variable is one fpmbus reads, with a value it accepts, or a word list for ExecStart.
			for k, v := range env {
				if strings.HasPrefix(k, "FPMBUS_") && strings.HasSuffix(k, "_FLAGS") {
					continue
				}
				if !declaredEnv(k) {
					t.Errorf("%s=%s: fpmbus reads no such variable", k, v)
					continue
				}
				t.Setenv(k, v)
				if _, _, err := environment.Value(k); err != nil {
					t.Errorf("%s=%s: %v", k, v, err)
				}
			}
			// The real parser of that command: every flag must parse; -h then stops before connecting.
			helpOutput = io.Discard
			t.Cleanup(func() { helpOutput = discardHelp })
			var out strings.Builder
			if code := runMain(context.Background(), append(args, "-h"), &out, &out); code != 0 {
				t.Fatalf("fpmbus %s: exit %d:\n%s", strings.Join(args, " "), code, out.String())
			}
		})
	}
	for k := range example {
		if strings.HasPrefix(k, "FPMBUS_") && strings.HasSuffix(k, "_FLAGS") && !expandedFlags[k] {
			t.Errorf("fpmbus.env.example sets %s, which no unit expands", k)
		}
	}
	// The pipeline's long-running stages each have a unit.
	for _, c := range []string{"bridge", "trace", "gaps", "merge", "seal"} {
		if !commandsWithUnits[c] {
			t.Errorf("no unit in %s runs fpmbus %s", systemdDir, c)
		}
	}
}

// declaredEnv reports whether fpmbus reads the variable name.
func declaredEnv(name string) bool {
	for _, v := range environment {
		if v.Name == name {
			return true
		}
	}
	return false
}
