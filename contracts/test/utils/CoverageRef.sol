// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {StakeRegistry} from "../../src/StakeRegistry.sol";

/// @dev The reference the coverage checkpoints are tested against, recomputed from the accounts:
///      for `fp`, the summed weight and the number of its counting declarations (declared, not
///      leaving, weight > 0), and the weight of all verifiers `vs`.
library CoverageRef {
    function recompute(StakeRegistry stakes, address[] memory vs, bytes32 fp)
        internal
        view
        returns (uint256 sum, uint256 count, uint256 total)
    {
        for (uint256 i = 0; i < vs.length; i++) {
            uint256 w = stakes.weightOf(vs[i]);
            total += w;
            (bytes32[] memory fps, uint64[] memory leaveAt) = stakes.declarationsOf(vs[i]);
            for (uint256 j = 0; j < fps.length; j++) {
                if (fps[j] == fp && leaveAt[j] == 0 && w != 0) {
                    sum += w;
                    count++;
                }
            }
        }
    }
}
