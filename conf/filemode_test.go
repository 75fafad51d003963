package conf

import "testing"

func TestFileMode(t *testing.T) {
	for _, tc := range []struct {
		text string
		want FileMode
		err  string
	}{
		{"0660", 0o660, ""},
		{"640", 0o640, ""},
		{"0600", 0o600, ""},
		{"0999", 0, `invalid file mode "0999": write the permission bits in octal, as in "0640" or "0660"`},
		{"01777", 0, `invalid file mode "01777": write the permission bits in octal, as in "0640" or "0660"`},
		{"0440", 0, `file mode "0440" must give the owner read and write (0600): streamd reads the file and appends to it`},
	} {
		var m FileMode
		err := m.UnmarshalText([]byte(tc.text))
		switch {
		case tc.err == "" && (err != nil || m != tc.want):
			t.Errorf("%q: %v, %v; want %v", tc.text, m, err, tc.want)
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%q: error %v, want %q", tc.text, err, tc.err)
		}
	}
}
