// cohort-gdcm: the helper process in which GDCM decodes DICOM pixel data for a thread of a
// Cohort process (see include/cohort/data/dicom.h). Not run by hand.
#include "cohort/data/dicom.h"

int main() {
  return cohort::data::serve_gdcm_decoding();
}
