package cleanup

import (
	"errors"
	"slices"
	"testing"
)

// build makes n steps, each recorded in made and undone into undone;
// step fail (if in range) fails before it is made.
func build(n, fail int, made, undone *[]int) (err error) {
	var cu Cleanup
	defer cu.Clean()
	for i := range n {
		if i == fail {
			return errors.New("step failed")
		}
		*made = append(*made, i)
		cu.Add(func() { *undone = append(*undone, i) })
	}
	cu.Release()
	return nil
}

func TestFailureUndoesWhatWasMadeNewestFirst(t *testing.T) {
	var made, undone []int
	if err := build(5, 3, &made, &undone); err == nil {
		t.Fatal("build succeeded past a failing step")
	}
	if want := []int{0, 1, 2}; !slices.Equal(made, want) {
		t.Fatalf("made %v, want %v", made, want)
	}
	if want := []int{2, 1, 0}; !slices.Equal(undone, want) {
		t.Fatalf("undone %v, want %v (what was made, newest first)", undone, want)
	}
}

func TestSuccessUndoesNothing(t *testing.T) {
	var made, undone []int
	if err := build(4, -1, &made, &undone); err != nil {
		t.Fatal(err)
	}
	if len(made) != 4 || len(undone) != 0 {
		t.Fatalf("made %v undone %v, want 4 made and nothing undone", made, undone)
	}
}

func TestCleanRunsOnce(t *testing.T) {
	n := 0
	c := Make(func() { n++ })
	c.Add(nil)
	c.Clean()
	c.Clean()
	if n != 1 {
		t.Fatalf("the undo ran %d times, want once", n)
	}
}

func TestReleaseHandsTheUndoOver(t *testing.T) {
	var order []string
	c := Make(func() { order = append(order, "a") })
	c.Add(func() { order = append(order, "b") })
	undo := c.Release()
	c.Clean()
	if len(order) != 0 {
		t.Fatalf("Clean after Release ran %v", order)
	}
	undo()
	if want := []string{"b", "a"}; !slices.Equal(order, want) {
		t.Fatalf("the released undo ran %v, want %v", order, want)
	}
}
