package manager

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

// ParseCPU parses a CPU quantity into millicores: "500m" (millicores), or a
// decimal number of cores ("0.5", "2"). Sub-millicore precision and
// non-positive amounts are refused rather than rounded, so what the
// operator typed is what ctld leases.
func ParseCPU(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("parse cpu %q: empty", s)
	}
	var millis *big.Rat
	if num, ok := strings.CutSuffix(s, "m"); ok {
		r, err := parseDecimal(num)
		if err != nil {
			return 0, fmt.Errorf("parse cpu %q: %w", s, err)
		}
		millis = r
	} else {
		r, err := parseDecimal(s)
		if err != nil {
			return 0, fmt.Errorf("parse cpu %q: %w", s, err)
		}
		millis = r.Mul(r, big.NewRat(1000, 1))
	}
	return toPositiveInt(millis, "cpu", s, "millicore")
}

// memoryUnits maps suffixes to multipliers: binary (Ki..Ei) as Kubernetes
// and cgroups users write them, decimal (k/K..E) for completeness.
var memoryUnits = []struct {
	suffix string
	mult   int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
}

// ParseMemory parses a memory quantity into bytes: "256Mi", "1Gi", "512M",
// "1.5Gi" or a plain byte count.
func ParseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("parse memory %q: empty", s)
	}
	num, mult := s, int64(1)
	// Two-letter suffixes first so "Mi" is not read as "M" + garbage.
	for _, u := range memoryUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	r, err := parseDecimal(num)
	if err != nil {
		return 0, fmt.Errorf("parse memory %q: %w", s, err)
	}
	return toPositiveInt(r.Mul(r, big.NewRat(mult, 1)), "memory", s, "byte")
}

// parseDecimal accepts only plain decimals ("2", "0.5", ".5"): big.Rat's
// SetString would also take fractions and exponents, which no operator means.
func parseDecimal(s string) (*big.Rat, error) {
	if s == "" || strings.Trim(s, "0123456789.") != "" || strings.Count(s, ".") > 1 || s == "." {
		return nil, fmt.Errorf("not a decimal number")
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("not a decimal number")
	}
	return r, nil
}

func toPositiveInt(r *big.Rat, what, s, unit string) (int64, error) {
	if !r.IsInt() {
		return 0, fmt.Errorf("parse %s %q: not a whole number of %ss", what, s, unit)
	}
	n := r.Num()
	if n.Sign() <= 0 {
		return 0, fmt.Errorf("parse %s %q: must be positive", what, s)
	}
	if !n.IsInt64() || n.Int64() == math.MaxInt64 {
		return 0, fmt.Errorf("parse %s %q: too large", what, s)
	}
	return n.Int64(), nil
}

// FormatCPU renders millicores the way ParseCPU reads them back.
func FormatCPU(millis int64) string {
	if millis%1000 == 0 {
		return fmt.Sprintf("%d", millis/1000)
	}
	return fmt.Sprintf("%dm", millis)
}

// FormatMemory renders bytes with the largest binary unit that divides them
// exactly, so the output parses back to the same number.
func FormatMemory(b int64) string {
	units := []string{"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"}
	for i, u := range units {
		m := int64(1) << (10 * (6 - i))
		if b != 0 && b%m == 0 {
			return fmt.Sprintf("%d%s", b/m, u)
		}
	}
	return fmt.Sprintf("%d", b)
}
