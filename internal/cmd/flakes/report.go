package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// flake is one test's, or one package's, failures over all the runs.
type flake struct {
	first failure // the first failure, whose output the report shows
	runs  []int   // the runs it failed in, from 1
	seeds []string
}

// tally counts the failures of every run.
type tally struct {
	runs   int      // runs added
	failed []int    // runs with a failure
	flakes []*flake // in the order they first failed
}

// add records the failures of run number run, and returns those failing
// for the first time.
func (t *tally) add(run int, fails []failure) (first []failure) {
	t.runs++
	if len(fails) > 0 {
		t.failed = append(t.failed, run)
	}
	for _, f := range fails {
		i := slices.IndexFunc(t.flakes, func(fl *flake) bool {
			return fl.first.pkg == f.pkg && fl.first.name == f.name && (f.name != "" || fl.first.note == f.note)
		})
		if i < 0 {
			i = len(t.flakes)
			t.flakes = append(t.flakes, &flake{first: f})
			first = append(first, f)
		}
		fl := t.flakes[i]
		if !slices.Contains(fl.runs, run) {
			fl.runs = append(fl.runs, run)
			fl.seeds = append(fl.seeds, f.seed)
		}
	}
	return first
}

// save writes the whole output of f to a new file in the temporary
// directory and returns its path.
func (f failure) save() (string, error) {
	file, err := os.CreateTemp("", "flakes-*.log")
	if err != nil {
		return "", err
	}
	for _, l := range f.lines {
		fmt.Fprintln(file, l)
	}
	return file.Name(), file.Close()
}

// show writes how f failed: the command that runs its package again in the
// same order, and up to tail lines of its output.
func (f failure) show(w io.Writer, tail int) {
	if f.rerun != "" {
		fmt.Fprintf(w, "    again: %s\n", f.rerun)
	}
	for _, l := range excerpt(f.lines, tail) {
		fmt.Fprintf(w, "    | %s\n", l)
	}
}

// report writes the summary: every failure, most frequent first, with the
// runs and seeds it failed with and up to tail lines of its first output.
func (t *tally) report(w io.Writer, tail int) {
	if len(t.failed) == 0 {
		fmt.Fprintf(w, "flakes: 0 of %d runs failed\n", t.runs)
		return
	}
	fmt.Fprintf(w, "flakes: %d of %d runs failed (runs %s)\n", len(t.failed), t.runs, join(t.failed))
	byCount := slices.Clone(t.flakes)
	slices.SortStableFunc(byCount, func(a, b *flake) int { return len(b.runs) - len(a.runs) })
	for _, fl := range byCount {
		var where []string
		for i, r := range fl.runs {
			if fl.seeds[i] == "" {
				where = append(where, fmt.Sprintf("run %d", r))
			} else {
				where = append(where, fmt.Sprintf("run %d seed %s", r, fl.seeds[i]))
			}
		}
		fmt.Fprintf(w, "\n--- FAIL %s: %d of %d runs (%s)\n", fl.first.title(), len(fl.runs), t.runs, strings.Join(where, ", "))
		fl.first.show(w, tail)
	}
}

// join writes runs as "2, 5".
func join(runs []int) string {
	s := make([]string, len(runs))
	for i, r := range runs {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}
